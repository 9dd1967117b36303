"""The batched engine's AR step at B = 4 (smollm2-135m, 4 prompts of 64 tokens, 40 tokens, the mean
t_verify of the full steps after 3): generate_ar and off steps inside an EAGLE-3 generation, each with a
small slot cache and with a large one (a 1,800-token prompt in the queue), twice in turn. How far the same
step moves within minutes on a shared VM (BENCHMARKS log S3).

    .venv/bin/python docs/adhoc/batch_ar_step_retime.py
"""
import statistics

from pipeline.decode.batch_engine import BatchEngine
from pipeline.decode.controller import StaticController, StepShape
from pipeline.decode.head import load_head
from pipeline.decode.target import load_target
from pipeline.profiling.profile import context_prompt

t = load_target("smollm2-135m")
be = BatchEngine(t.model, load_head("default", t.model), eos_token_ids=set())
ps = [context_prompt(t.tokenizer, 64, r) for r in range(4)]
big = ps + [ps[0] * 28]                                     # a long queued prompt: S grows to ~1,900
off = lambda: StaticController(StepShape.off())


def mean_ms(res):
    s = [x.t_verify for x in res.steps if x.batch_size == 4][3:]
    return f"{1e3 * statistics.mean(s):.1f} ms over {len(s)} steps"


for rep in range(2):
    print("generate_ar, small S ", mean_ms(be.generate_ar(ps, 40, batch_size=4)))
    print("off steps,   small S ", mean_ms(be.generate(ps, 40, batch_size=4, controller=off())))
    print("generate_ar, large S ", mean_ms(be.generate_ar(big, [40] * 4 + [1], batch_size=4)))
    print("off steps,   large S ", mean_ms(be.generate(big, [40] * 4 + [1], batch_size=4, controller=off())), flush=True)
