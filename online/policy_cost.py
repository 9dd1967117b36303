"""`draftgym profile-policy`: what one call of a trained policy costs inside the real engine.

The generic `policy` row of `draftgym profile` times a stand-in MLP forward. A real controller call
also builds its observation from the engine's tensors (device -> numpy, sorting, padding) and runs
the checkpoint's own network, which for LTD's 1112-feature size policy is ~30x the stand-in. So,
for each checkpoint, this command decodes a few prompts with the policy in the loop and writes

    op = 'policy:<latency_key>'   median / p10 / p90 over generations of
                                  sum(t_controller) / policy calls      (seconds per call)

into the newest profile of `--logs` for this device (same profile_id, its own Parquet file), where
`simulator.latency.model.LatencyModel.call_s` picks it up. Calls are counted as the replay counts them
(`simulator.replay.simulate`): the inferences plan() reports, one per continue_drafting() asked, one
per verify_size() of a size policy. Observation building, plan() and observe() bookkeeping are all
in t_controller, so the per-call figure carries them: the simulator's t_policy per cycle then equals
the engine's measured controller time per cycle, which is what sim-vs-real compares.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from online.adapters.policy import PolicyController
from pipeline.decode.engine.single import Engine
from pipeline.errors import DataError, DraftGymError
from pipeline.logs.schema import read_table, SCHEMA_VERSION, table_files
from pipeline.models.head import load_head_for
from pipeline.models.target import encode_prompt, load_target
from pipeline.profiling.profile import profile_rows, write_profile
from pipeline.profiling.timed_ops import stats_of
from pipeline.runtime.fingerprint import device_name, environment_fingerprint
from simulator.latency.estimate import DEFAULT_POINT, with_point
from simulator.methods.checkpoint import load_checkpoint

PROMPTS = ("Explain how a hash map works, step by step.",
           "Write a Python function that returns the n-th Fibonacci number.",
           "What are three good habits for a healthy sleep schedule?")


def newest_profile(logs: str, model: str, device: str) -> dict:
    """The newest `latency` row set of `model` on `device` under `logs` (its first row, as a dict)."""
    rows = []
    for f in table_files(logs, "latency"):
        t = read_table(f, "latency")
        rows += [r for r in t.select(["profile_id", "device", "model_id", "head_id", "dtype", "device_type"]).to_pylist()
                 if r["model_id"] == model]
    if not rows:
        raise DataError(f"no latency profile for {model} under {logs}/latency (run `draftgym profile` first)")
    mine = [r for r in rows if r["device"] == device]
    if not mine:
        have = sorted({r["device"] for r in rows})
        raise DataError(f"no latency profile for device {device!r} under {logs} (profiles exist for: {', '.join(have)})")
    return max(mine, key=lambda r: r["profile_id"])


def measure_policy_cost(engine, tokenizer, controller, n_tokens: int = 48, prompts=PROMPTS) -> list[float]:
    """Seconds per policy call, one figure per generation (after one warm-up generation)."""
    ids = [encode_prompt(tokenizer, p) for p in prompts]
    engine.generate(ids[0], 8, controller=controller)
    per_call = []
    for x in ids:
        res = engine.generate(x, n_tokens, controller=controller)
        calls = controller.calls
        if calls > 0:
            per_call.append(sum(c.t_controller for c in res.cycles) / calls)
    return per_call


def run_profile_policy(policies: list[str], logs: str, model: str = "smollm2-135m", head_spec: str = "default",
                       n_tokens: int = 48, device: str | None = None, progress: bool = True,
                       dtype: str | None = None) -> dict:
    """Load the checkpoints, the target and the head, then `profile_policies`."""
    if not table_files(logs, "latency"):       # fail before loading any model
        raise DataError(f"no latency profile under {logs}/latency (run `draftgym profile` first)")
    loaded = [(spec, load_checkpoint(spec)) for spec in policies]     # bad checkpoints fail before the model loads
    target = load_target(model, device=device, dtype=dtype)
    head = load_head_for(head_spec, target.model)
    engine = Engine(target.model, head, target.eos_token_ids)
    return profile_policies(engine, target.tokenizer, loaded, logs, model, n_tokens, progress)


def profile_policies(engine, tokenizer, loaded: list, logs: str, model: str, n_tokens: int = 48,
                     progress: bool = True) -> dict:
    """loaded: [(spec, Policy from load_checkpoint)]. Times each in `engine` and writes its
    'policy:<latency_key>' row next to the newest profile of this device under `logs`."""
    from tqdm import tqdm

    dev = engine.device
    base = newest_profile(logs, model, device_name(dev, engine.dtype))     # the name carries the dtype
    env = json.dumps(environment_fingerprint(dev, engine.dtype))
    rows, out = [], {}
    for spec, policy in tqdm(loaded, desc="profile-policy", unit="policy", disable=not progress):
        key = policy.latency_key
        per_call = measure_policy_cost(engine, tokenizer, PolicyController(policy), n_tokens)
        if not per_call:
            raise DraftGymError(f"{spec}: the policy made no calls (nothing to time)")
        stats = stats_of(per_call)
        rows.append({"schema_version": SCHEMA_VERSION, "profile_id": base["profile_id"], "device": base["device"],
                     "device_type": base["device_type"], "model_id": model, "head_id": base["head_id"],
                     "dtype": base["dtype"], "op": f"policy:{key}", "width": 0, "verify_size": 0, "context_len": 0,
                     "batch": 1, **stats, "env_json": env})
        row = {"op": f"policy:{key}", "batch": 1, **stats}
        out[key] = with_point([row], DEFAULT_POINT)[0][DEFAULT_POINT]   # what the latency model charges

    # next to the profile's own file (pipeline.profiling.profile), so every latency reader finds it
    path = write_profile(rows, logs, model, f"{base['profile_id']}-policies-{time.strftime('%Y%m%d-%H%M%S')}")
    return {"profile_id": base["profile_id"], "device": base["device"], "per_call_s": out, "path": str(path)}


def copy_policy_rows(logs: str, model: str, src_profile: str, dst_profile: str) -> int:
    """Give profile `dst_profile` the 'policy:<key>' rows of `src_profile` (same device, same root),
    e.g. validate's pooled interleaved profile gets the call costs timed right before decoding.
    Returns the number of rows copied."""
    rows = [{**r, "profile_id": dst_profile} for r in profile_rows(logs, src_profile)
            if r["model_id"] == model and str(r["op"]).startswith("policy:")]
    if rows:
        write_profile(rows, logs, model, f"{dst_profile}-policies-from-{src_profile}")
    return len(rows)


@dataclass
class ProfilePolicyConfig:
    """`draftgym profile-policy`: time trained policies' controller calls in the engine, into the newest
    latency profile of this device under `logs`."""

    policies: list[str] = field(default_factory=list)   # checkpoint directories (`draftgym train`'s --out)
    logs: str = "data/logs"                # logs root holding the device's latency profile
    model: str = "smollm2-135m"            # target: 'smollm2-135m' (embedded), a HF model directory or a hub id
    head: str = "default"                  # EAGLE-3 head: 'default', 'random', a directory or a hub id
    max_new_tokens: int = 48               # tokens decoded per timing generation
    device: str | None = None              # None: cuda if present, else cpu
    dtype: str | None = None               # None: the device's default (pipeline.models.target.resolve_dtype_name)
    as_json: bool = False                  # print the result as one JSON object
    progress: bool = True                  # progress bars


def run_profile_policy_command(cfg: ProfilePolicyConfig) -> int:
    r = run_profile_policy(cfg.policies, cfg.logs, model=cfg.model, head_spec=cfg.head, n_tokens=cfg.max_new_tokens,
                           device=cfg.device, dtype=cfg.dtype, progress=cfg.progress)
    if cfg.as_json:
        print(json.dumps(r))
    else:
        for k, v in r["per_call_s"].items():
            print(f"{k}: {1e3 * v:.3f} ms per call (mean)")
        print(f"-> {r['path']} (profile {r['profile_id']}, {r['device']})")
    return 0
