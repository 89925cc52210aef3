"""bench.fw_worker's PyTorch workloads, each a loader (imports, no CUDA) that returns its builder (on the GPU):

- ``resnet``: torchvision's ResNet-50 at 224x224, inference (``inf16``, ``inf64``, ``inf128``: batch) and training
  (``train64``: SGD with momentum), in images;
- ``graph``: a small transformer's decode step (the next token of each sequence, appended to a sliding window)
  captured once with ``torch.cuda.CUDAGraph`` and replayed 16 times a step, as vLLM's and SGLang's decode replays
  its graphs; in tokens;
- ``compile``: the same transformer's forward under ``torch.compile`` (mode ``default``: Inductor's Triton kernels;
  ``reduce-overhead`` would replay them as CUDA graphs, which ``graph`` covers), in tokens;
- ``allreduce``: one rank of an NCCL all-reduce of 128 MiB (``torch.distributed``, the rendezvous on loopback TCP),
  in all-reduces.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable

import torch
import torch.nn.functional as F

from bench.fw_worker import Built, Variant

REPLAYS = 16  # graph replays per step, then one sync


def _sync() -> None:
    torch.cuda.synchronize()


def _memory() -> dict[str, int]:
    free, total = torch.cuda.mem_get_info()
    return {"free": int(free), "total": int(total)}


def resnet(args: argparse.Namespace) -> Callable[[], Built]:
    names = args.variants.split(",") if args.variants else ["inf16", "inf64", "inf128", "train64"]
    shapes = []
    for name in names:
        m = re.fullmatch(r"(inf|train)(\d+)", name)
        if m is None:
            raise SystemExit(f"fw_worker resnet: variant {name!r} is not inf<batch> or train<batch>")
        shapes.append((name, m.group(1) == "train", int(m.group(2))))
    import torchvision

    def build() -> Built:
        dev = torch.device("cuda")
        infer = torchvision.models.resnet50(weights=None).to(dev).eval()
        trained = None
        variants = {}
        for name, train, batch in shapes:
            x = torch.randn(batch, 3, 224, 224, device=dev)
            if train:
                if trained is None:
                    trained = torchvision.models.resnet50(weights=None).to(dev).train()
                variants[name] = Variant(_train_step(trained, x), "images", batch)
            else:
                variants[name] = Variant(_infer_step(infer, x), "images", batch)
        return Built(variants, _memory())

    return build


def _infer_step(model: torch.nn.Module, x: torch.Tensor) -> Callable[[bool], bool]:
    def step(go: bool) -> bool:
        with torch.inference_mode():
            model(x)
        _sync()
        return go

    return step


def _train_step(model: torch.nn.Module, x: torch.Tensor) -> Callable[[bool], bool]:
    y = torch.randint(0, 1000, (x.shape[0],), device=x.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(go: bool) -> bool:
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
        _sync()
        return go

    return step


class Block(torch.nn.Module):
    """A pre-norm transformer block: causal attention (scaled_dot_product_attention) and an MLP."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        out: torch.Tensor = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return out


class TinyGPT(torch.nn.Module):
    """A small decoder-only transformer (6 blocks of width 512, 8 heads, 8192 tokens), in bfloat16."""

    def __init__(self, vocab: int = 8192, d: int = 512, heads: int = 8, layers: int = 6, context: int = 256) -> None:
        super().__init__()
        self.emb, self.pos = torch.nn.Embedding(vocab, d), torch.nn.Embedding(context, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = torch.nn.LayerNorm(d), torch.nn.Linear(d, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))  # type: ignore[no-any-return]


def _model(batch: int, seq: int) -> tuple[TinyGPT, torch.Tensor]:
    dev = torch.device("cuda")
    model = TinyGPT().to(dev, torch.bfloat16).eval()
    return model, torch.randint(0, 8192, (batch, seq), device=dev)


def graph_decode(args: argparse.Namespace) -> Callable[[], Built]:
    def build() -> Built:
        model, tokens = _model(16, 128)

        def decode() -> None:  # the next token of each sequence, appended to its window
            nxt = model(tokens)[:, -1].argmax(-1)
            tokens.copy_(torch.cat([tokens[:, 1:], nxt[:, None]], 1))

        with torch.no_grad():
            side = torch.cuda.Stream()  # type: ignore[no-untyped-call]  # warm-up on a side stream before capture, as PyTorch's docs ask
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    decode()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):  # capture_error_mode "global", PyTorch's default
                decode()

        def step(go: bool) -> bool:
            for _ in range(REPLAYS):
                graph.replay()
            _sync()
            return go

        return Built({"decode": Variant(step, "tokens", 16 * REPLAYS)}, _memory())

    return build


def compiled(args: argparse.Namespace) -> Callable[[], Built]:
    def build() -> Built:
        model, tokens = _model(16, 256)
        fwd = torch.compile(model)  # mode "default"

        def step(go: bool) -> bool:
            with torch.no_grad():
                fwd(tokens)
            _sync()
            return go

        return Built({"default": Variant(step, "tokens", 16 * 256)}, _memory())

    return build


def allreduce(args: argparse.Namespace) -> Callable[[], Built]:
    import torch.distributed as dist

    def build() -> Built:
        torch.cuda.set_device(args.rank)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                                world_size=args.world)
        x = torch.ones(32 << 20, device="cuda")  # 128 MiB of float32

        def step(go: bool) -> bool:
            x[0].fill_(1.0 if go else 0.0)  # every rank's wish to go on, summed with the data
            dist.all_reduce(x)
            return bool(x[0].item() > args.world - 0.5)  # .item() waits for the all-reduce

        return Built({"allreduce": Variant(step, "all-reduces", 1, collective=True)}, _memory())

    return build
