import time, numpy as np, torch
from simulator.policies.checkpoint import load_checkpoint
from simulator.policies.nets import torch_logits as _torch_logits
from simulator.observations import paper as obs
torch.set_num_threads(2)
p = load_checkpoint("data/policies/ltd-cpu")
W, D = 10, 2
scores = torch.randn(1, W + (D-1)*W*W)
def bench(f, n=300):
    for _ in range(20): f()
    t = time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter() - t) / n * 1e6
o_size = obs.ltd_size_obs(obs.sort_levels(obs.level_scores_from_pool(obs.to_numpy(scores[0]), W, D, 12), W)[None], np.array([D]), np.array([150]), W, 12, presorted=True)
o_depth = obs.ltd_depth_obs(np.random.randn(1, 100).astype(np.float32), 1, np.array([150]), W)
print("obs size build us", bench(lambda: obs.ltd_size_obs(obs.sort_levels(obs.level_scores_from_pool(obs.to_numpy(scores[0]), W, D, 12), W)[None], np.array([D]), np.array([150]), W, 12, presorted=True)))
print("size net torch us", bench(lambda: _torch_logits(p.size_net, o_size)))
print("depth net torch us", bench(lambda: _torch_logits(p.depth_net, o_depth)))
with torch.inference_mode():
    print("size net inference_mode us", bench(lambda: p.size_net(torch.from_numpy(o_size)).numpy()))
Ws = [(m.weight.detach().numpy().T.copy(), m.bias.detach().numpy()) for m in p.size_net if isinstance(m, torch.nn.Linear)]
mean, std = p.size_net[0].mean.numpy(), p.size_net[0].std.numpy()
def npf(x):
    h = (x - mean) / std
    for i, (w, b) in enumerate(Ws):
        h = h @ w + b
        if i < len(Ws) - 1: h = np.maximum(h, 0)
    return h
print("size net numpy us", bench(lambda: npf(o_size)))
print("max abs diff", np.abs(npf(o_size) - _torch_logits(p.size_net, o_size)).max())
torch.set_num_threads(1)
print("size net torch 1 thread us", bench(lambda: _torch_logits(p.size_net, o_size)))
