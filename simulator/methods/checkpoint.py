"""Policy checkpoints and the policy loader.

A checkpoint is a directory with manifest.json + one torch state_dict file per component:

    {"format": "draftgym-policy", "version": 1, "name": ..., "method": "ltd" | "radar" | "resps" | "resps-load"
              | "ltd-load" | "radar-load",
     "components": {"depth"|"size"|"radar"|"shape": {
         "file": "depth.pt",
         "net": {"type": "mlp", "in": 102, "hidden": [1024], "out": 2, "obs_norm": true}   |
                {"type": "radar_lstm", "in": 10, "hidden": 128, "mlp_hidden": 128, "out": 2},
         "obs": {"name": "ltd_depth" | "ltd_size" | "radar" | "resps", "variant": "paper" | "rich",
                 "width": 10, "max_depth": 12, "dim": 102},          # no variant: "paper" (older checkpoints)
         "action": {"type": "stop_continue", "max_depth": 12} | {"type": "verify_size", "values": [20, ..]} |
                   {"type": "shape", "shapes": [[V, D, W], ..], "hold": 30} |
                   {"type": "serving_shape", "shapes": ["off", "chain:2", "tree:4,10,60", ..], "hold": 5}}},
     (resps-load: a load-aware serving policy, obs {"name": "serving_load", ...}: simulator/serving/observations.py;
      ltd-load: components "depth" and "size", radar-load: "radar", both with "action": {.., "shapes": [..],
      "hold": N} and their W, D_max and V in "shape": simulator/methods/{ltd,radar}/serving_train.py write them)
     "shape": {"width": 10, "max_depth": 12, "verify_size": 60},    # defaults the hooks start from
     "training": {...}, "created": "..."}

`load_policy(spec)` accepts such a directory or a built-in name:
    static:D,W,V   ddd[:threshold]   entropy[:theta]   goodput   oracle[:static|depth]   random[:seed]
"""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from pipeline.errors import DraftGymError, first_line
from simulator.observations import paper as obs
from simulator.policies.nets import build_net
from simulator.observations.rich import OBS_VARIANTS
from simulator.policies.base import Policy
from simulator.methods.ltd.policy import LTDPolicy
from simulator.methods.radar.policy import RadarPolicy
from simulator.methods.resps.policy import RespsPolicy
from simulator.methods.ltd.serving_policy import LTDLoadPolicy
from simulator.methods.radar.serving_policy import RadarLoadPolicy
from simulator.methods.resps.serving_policy import LoadAwarePolicy

FORMAT = "draftgym-policy"
FORMAT_VERSION = 1
SERVING_METHODS = {"ltd-load": LTDLoadPolicy, "radar-load": RadarLoadPolicy}   # besides resps-load


def save_policy(out: str | Path, name: str, method: str, components: dict, shape: dict,
                training: dict | None = None) -> Path:
    """components: {cname: {"module": torch module, "net": spec, "obs": spec, "action": spec}}."""
    import torch

    from pipeline.runtime.atomic import atomic_write_json

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    man = {"format": FORMAT, "version": FORMAT_VERSION, "name": name, "method": method, "components": {},
           "shape": shape, "training": training or {}, "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
    for cname, c in components.items():
        f = f"{cname}.pt"
        torch.save(c["module"].state_dict(), out / f)
        man["components"][cname] = {"file": f, "net": c["net"], "obs": c["obs"], "action": c["action"]}
    atomic_write_json(man, out / "manifest.json")
    return out


def read_manifest(path: str | Path) -> dict:
    path = Path(path)
    f = path / "manifest.json" if path.is_dir() else path
    if not f.is_file():
        raise DraftGymError(f"no policy manifest at {f}")
    try:
        man = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise DraftGymError(f"{f}: not valid JSON ({e})") from None
    if man.get("format") != FORMAT or man.get("version") != FORMAT_VERSION:
        raise DraftGymError(f"{f}: not a {FORMAT} v{FORMAT_VERSION} manifest")
    return man


def load_checkpoint(path: str | Path, sample: bool = False, hold: int | None = None) -> Policy:
    import torch

    path = Path(path)
    man = read_manifest(path)
    nets = {}
    for cname, c in man["components"].items():
        net = build_net(c["net"])
        try:
            net.load_state_dict(torch.load(path / c["file"], map_location="cpu", weights_only=True))
        except (FileNotFoundError, RuntimeError) as e:
            raise DraftGymError(f"{path / c['file']}: cannot load ({first_line(e)})") from None
        net.eval()
        nets[cname] = net
    sh, name, method = man.get("shape", {}), man.get("name", path.name), man["method"]
    policy = _build_checkpoint_policy(man, nets, sh, name, method, path, sample, hold)
    policy.latency_key = latency_key(path, man)
    return policy


def latency_key(path: str | Path, man: dict | None = None) -> str:
    """'<name>-<10 hex>': the checkpoint's identity in a latency profile (`draftgym profile-policy`
    writes op = 'policy:<key>' rows; the replay charges that measured cost per call). The hash covers
    manifest.json and every weight file, so a retrained policy never inherits an old figure."""
    path = Path(path)
    if path.name == "manifest.json":
        path = path.parent
    man = read_manifest(path) if man is None else man
    h = hashlib.sha256((path / "manifest.json").read_bytes())
    for c in sorted(man["components"].values(), key=lambda c: c["file"]):
        h.update((path / c["file"]).read_bytes())
    return f"{man.get('name', path.name)}-{h.hexdigest()[:10]}"


def _build_checkpoint_policy(man, nets, sh, name, method, path, sample, hold) -> Policy:
    if method == "resps-load":          # a serving-step policy: its own observation, no variant
        c = man["components"]["shape"]
        return LoadAwarePolicy(nets["shape"], c["action"]["shapes"], hold=hold or c["action"]["hold"], obs=c["obs"],
                               name=name, sample=sample)
    if method in SERVING_METHODS:       # the other load-aware serving policies read their own manifest parts
        return SERVING_METHODS[method].from_checkpoint(man, nets, name, sample=sample, hold=hold)
    variants = {c["obs"].get("variant", "paper") for c in man["components"].values()}
    if len(variants) != 1 or not variants <= set(OBS_VARIANTS):
        raise DraftGymError(f"{path}: components disagree on, or have an unknown, observation variant {sorted(variants)}")
    variant = variants.pop()
    if method == "ltd":
        size_values = man["components"].get("size", {}).get("action", {}).get("values", obs.SIZE_ACTIONS)
        return LTDPolicy(nets.get("depth"), nets.get("size"), width=sh.get("width", 10),
                         max_depth=sh.get("max_depth", 12), verify_size=sh.get("verify_size", 60),
                         size_values=size_values, name=name, sample=sample, fixed_depth=sh.get("depth", 8),
                         obs_variant=variant)
    if method == "radar":
        a = man["components"]["radar"]["action"]
        return RadarPolicy(nets["radar"], width=sh.get("width", 10), verify_size=sh.get("verify_size", 60),
                           max_calls=a.get("max_depth", obs.RADAR_MAX_CALLS), name=name, sample=sample,
                           obs_variant=variant)
    if method == "resps":
        a = man["components"]["shape"]["action"]
        return RespsPolicy(nets["shape"], a["shapes"], hold=hold or a.get("hold", 30),
                           max_depth=sh.get("max_depth", 12), name=name, sample=sample, obs_variant=variant)
    raise DraftGymError(f"{path}: unknown policy method {method!r}")
