"""The paper's Figure 1 at scale on one GPU: the eigensolvers alone, the workload end to end, the accuracy check.

    python benchmarks/gpu/figure1.py solvers  [--sizes 128,256,512] [--matrices 2048] [--loop 64] [--device cuda]
    python benchmarks/gpu/figure1.py workload [--samples 10000] [--batch-size 32] [--dtype float16] [--device cuda]
    python benchmarks/gpu/figure1.py accuracy [--model .gpu/minilm16] [--samples 16] [--length 512] [--device cuda]

solvers: matrices per second for the Gram matrices P Pᵀ of softmax P (temperatures 0.5…6) at each n — torch's
eigvalsh (which loops one matrix at a time above 32 × 32 on CUDA; timed on `--loop` matrices), cuSOLVER's batched
eigensolver alone in float64 and float32 (`spectra.cusolver`, `--matrices` per call, up to its limit), and the
whole batched route from P (`spectra.batched`: Gram matrix, bound, fallbacks) at the tolerances 1e-6, 1e-5 and
1e-4 on softmax P and on rank-collapsed P (a random encoder's deep layers), with the share of matrices each level
took (float32, float64, Jordan–Wielandt, SVD); the batched solver on the Jordan–Wielandt matrices (2n) alone; and,
at the largest n, the batched solver at smaller calls (the probe hands it one layer of a batch: batch size × heads
matrices).
workload: `spectra analyze` on a RoBERTa-base-shaped encoder with random weights (12 layers × 12 heads, hidden 768,
initialised with --init; from layer 4 on its attention collapses to uniform, rank-collapsed P that fail the Gram
bound: benchmarks/gram_levels.py), or with `--encoder real` on --model's real weights (MiniLM: 6 × 12 heads, so
20,000 sequences are Figure 1's 1.44 M matrices), at n = 512, `--samples` sequences,
the model in `--dtype`, the spectra by `--spectrum-device` (default cuda); it prints the rate as it goes (so a
run stopped at its time limit still gives one) and at the end the seconds, the projection to Figure 1's 1.44 M
matrices and
what run.json says of the route and the stages.
accuracy: the same sequences analysed with the spectra on the CPU's float64 route (the reference) and by the
batched GPU route at each tolerance, the model on the same device (so P is the same): max |Δ c@k| over layers and
heads and max |Δc| over the whole mean curve, each against its tolerance; exit 1 when one is not held. The model is
--model when it exists (prepare.py's MiniLM in float16), else the random RoBERTa-base-shaped one.

Every line is printed as soon as it is measured. With `--device cpu` every part runs where no GPU is, on small
sizes, with the route emulated by torch's eigvalsh as the solver (a check that the script runs, not a figure).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import tiny  # noqa: E402  (tests/tiny.py: the offline tokenizer and text)

import spectra  # noqa: E402
from spectra import batched, cusolver  # noqa: E402

TOLERANCES = (batched.EXACT, batched.FLOAT64_TOLERANCE, batched.FLOAT32_TOLERANCE)
FIGURE1 = 10_000 * 144  # sequences × (layers · heads) of RoBERTa-base at n = 512


def say(line: str) -> None:
    print(line, flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def softmax(count: int, n: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    """count softmax matrices (float32) at temperatures 0.5…6, made on `device`."""
    generator = torch.Generator(device).manual_seed(seed)
    scale = torch.linspace(0.5, 6, count, device=device)[:, None, None]
    return torch.softmax(scale * torch.randn(count, n, n, generator=generator, device=device), -1)


def collapsed(count: int, n: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    """count rank-collapsed softmax matrices (float32): one key vector shared by every query plus noise of 0 … 1e-4,
    the deep layers of a randomly initialised encoder (whose tokens' states converge), which fail the Gram bound."""
    generator = torch.Generator(device).manual_seed(seed)
    noise = torch.logspace(-7, -4, count, device=device)[:, None, None]
    shared = torch.randn(count, 1, n, generator=generator, device=device, dtype=torch.float64)
    logits = shared + noise * torch.randn(count, n, n, generator=generator, device=device, dtype=torch.float64)
    return torch.softmax(logits, -1).float()


def rate(fn: Callable[[], object], count: int, device: torch.device) -> float:
    """Matrices per second of fn over `count` matrices (the second of two calls: the first pays set-up)."""
    fn()
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return count / (time.perf_counter() - start)


def solvers(args: argparse.Namespace) -> None:
    device = torch.device(args.device)
    gpu = device.type == "cuda"
    if gpu:
        library = cusolver.require(device)
        say(f"{torch.cuda.get_device_name(device)}; libcusolver {library.version} ({library.path})")
    say("| n | route | matrices per call | matrices/s | Figure 1 (1.44 M) at this rate | precisions used |")
    say("|---|---|---|---|---|---|")

    def row(n: int, name: str, per_call: int, value: float, used: str = "") -> None:
        say(f"| {n} | {name} | {per_call} | {value:,.0f} | {FIGURE1 / value / 60:.1f} min | {used} |")

    for n in (int(x) for x in args.sizes.split(",")):
        count = min(args.matrices, cusolver.per_call(n))
        p = softmax(count, n, device, seed=n)
        gram = p.double() @ p.double().mT
        loop = gram[: args.loop]
        for dtype in (torch.float64, torch.float32):
            name = str(dtype).split(".")[-1]
            row(n, f"torch eigvalsh {name} ({'loop' if gpu and n > 32 else 'batched'})", len(loop),
                rate(lambda: torch.linalg.eigvalsh(loop.to(dtype)), len(loop), device))
            if gpu:
                g = gram.to(dtype)
                row(n, f"cuSOLVER XsyevBatched {name}", count,
                    rate(lambda: batched.cusolver_eigenvalues(g.clone()), count, device))
        solve = batched.cusolver_eigenvalues if gpu else torch.linalg.eigvalsh
        jordan = batched.jordan_wielandt(p[: count // 8].double())  # 2n × 2n: a quarter of the calls' limit
        row(n, f"{'cuSOLVER XsyevBatched' if gpu else 'torch eigvalsh'} float64, Jordan–Wielandt (2n)", len(jordan),
            rate(lambda: solve(jordan.clone()), len(jordan), device))
        del jordan
        for label, part in (("softmax P", p if gpu else p[: args.loop]),
                            ("rank-collapsed P", collapsed(count if gpu else args.loop, n, device, seed=n))):
            for tolerance in TOLERANCES:
                levels: list[torch.Tensor] = []
                value = rate(lambda: levels.append(batched.gram_sigma(part, tolerance, solve)[1]), len(part), device)
                shares = torch.bincount(levels[-1].long().cpu(), minlength=len(batched.LEVELS)) / len(part)
                row(n, f"batched route, {label}, tolerance {tolerance:.0e}{'' if gpu else ' (emulated)'}", len(part),
                    value, ", ".join(f"{name} {share:.0%}" for name, share in zip(batched.LEVELS, shares.tolist())))
            del part
        if gpu and n == max(int(x) for x in args.sizes.split(",")):
            for calls in (32 * 12, 8 * 12, 2048):
                if calls < count:
                    g = gram[:calls].clone()
                    row(n, "cuSOLVER XsyevBatched float64 (smaller calls)", calls,
                        rate(lambda: batched.cusolver_eigenvalues(g.clone()), calls, device))
        del p, gram, loop
        if gpu:
            torch.cuda.empty_cache()


def roberta_base(root: Path, n: int, init: float) -> Path:
    """A RoBERTa-base-shaped masked LM with random weights (std `init`) and the tests' offline tokenizer."""
    from transformers import AutoTokenizer, RobertaConfig, RobertaForMaskedLM

    folder = tiny.save_model(root / "roberta-base-shape", "roberta")  # the tokenizer; the model is replaced
    tokenizer = AutoTokenizer.from_pretrained(folder)
    torch.manual_seed(0)
    config = RobertaConfig(vocab_size=len(tokenizer), max_position_embeddings=n + 2, initializer_range=init,
                           pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.cls_token_id,
                           eos_token_id=tokenizer.sep_token_id)  # base: 12 layers, 12 heads, 768, 3072
    RobertaForMaskedLM(config).save_pretrained(folder)
    return folder


def corpus(root: Path, tokens: int) -> Path:
    """Enough of the tests' pseudo-text for `tokens` packed tokens (with a margin)."""
    lines = tiny.corpus_lines(tokens // 12 + 1000)  # ≥ 21 words a line on average, one token each or more
    path = root / "corpus.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def repeated(source: Path, root: Path, tokens: int) -> Path:
    """The real text of `source` repeated until it holds `tokens` packed tokens (at ≥ 1 token per 5 characters):
    the licence texts are ~60k tokens, the workload asks for millions; the timing needs real attention, not new
    text."""
    text = source.read_text()
    path = root / "repeated.txt"
    path.write_text("\n\n".join([text] * -(-tokens * 5 // len(text))))
    return path


def workload(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp())
    if args.encoder == "real":
        if not Path(args.model).exists():
            raise SystemExit(f"--encoder real reads --model {args.model}, which is not there (prepare.py makes it)")
        model, name = Path(args.model), f"{args.model} (real weights)"
        text = repeated(Path(args.data), root, args.samples * args.length) if Path(args.data).exists() else \
            corpus(root, args.samples * args.length)
    else:
        model, name = roberta_base(root, args.length, args.init), f"RoBERTa-base shape, random weights (std {args.init})"
        text = corpus(root, args.samples * args.length)
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model)
    per_sequence = config.num_hidden_layers * config.num_attention_heads
    say(f"{name}, n = {args.length}, {args.samples} sequences ({args.samples * per_sequence:,} matrices), batch "
        f"{args.batch_size}, {args.dtype} on {args.device}, spectra: {args.spectrum_device}, tolerance "
        f"{args.tolerance:.0e}")
    start, marks = time.perf_counter(), []
    printed = [0.0]

    def progress(done: int, total: int) -> None:
        marks.append((time.perf_counter(), done))
        elapsed = marks[-1][0] - start
        if len(marks) <= 3 or done == total or elapsed - printed[0] >= 10:  # the first batches, then every 10 s
            printed[0] = elapsed
            say(f"{done}/{total} sequences in {elapsed:.1f} s: {done / elapsed:.1f} sequences/s, "
                f"{done * per_sequence / elapsed:,.0f} matrices/s")

    run = spectra.analyze(str(model), str(text), length=args.length, samples=args.samples, batch_size=args.batch_size,
                          device=args.device, dtype=args.dtype, spectrum_device=args.spectrum_device,
                          spectrum_tolerance=args.tolerance, out=root / "run", notify=lambda line: None,
                          progress=progress)
    seconds = time.perf_counter() - start
    meta = json.loads((run.path / "run.json").read_text())
    steady = (marks[-1][0] - marks[0][0]) / max(1, marks[-1][1] - marks[0][1]) if len(marks) > 1 else float("nan")
    say(f"done: {args.samples} sequences in {seconds:.1f} s (model load included); steady {steady * 1e3:.1f} ms per "
        f"sequence: Figure 1's {FIGURE1:,} matrices in {steady * FIGURE1 / per_sequence:.0f} s")
    say("run.json: " + json.dumps({key: value for key, value in meta.items() if key.startswith("spectrum")
                                   or key in ("overlap", "timings", "stages")}, default=str))


def accuracy(args: argparse.Namespace) -> int:
    root = Path(tempfile.mkdtemp())
    if Path(args.model).exists():
        model, name = args.model, f"{args.model} (real weights)"
        text = args.data if Path(args.data).exists() else str(corpus(root, args.samples * args.length))
    else:
        model, name = str(roberta_base(root, args.length, args.init)), "RoBERTa-base shape, random weights"
        text = str(corpus(root, args.samples * args.length))
    common = dict(length=args.length, samples=args.samples, batch_size=8, device=args.device, progress=None,
                  notify=lambda line: None)

    def measured(label: str, **options) -> tuple[np.ndarray, np.ndarray]:
        start = time.perf_counter()
        run = spectra.analyze(model, text, out=root / label, **common, **options)
        table = run.path / "metrics.csv"
        import pandas as pd

        c_at = pd.read_csv(table).sort_values(["layer", "head"])["c_at_mean"].to_numpy()
        curves = np.load(run.path / "curves.npz")["cum_mean"]
        say(f"{label}: {time.perf_counter() - start:.1f} s")
        return c_at, curves

    say(f"{name}, n = {args.length}, {args.samples} sequences, model on {args.device}")
    reference = measured("cpu-float64", spectrum_device="cpu")
    say("| route | tolerance | max |Δ c@k| over layers × heads | max |Δc| over the mean curves | held |")
    say("|---|---|---|---|---|")
    failed = 0
    place = "cuda" if args.device == "cuda" else "cpu"  # on the CPU: the script's own check, the same route
    for tolerance in TOLERANCES:
        c_at, curves = measured(f"{place}-{tolerance:.0e}", spectrum_device=place, spectrum_tolerance=tolerance)
        worst = float(np.abs(c_at - reference[0]).max()), float(np.nanmax(np.abs(curves - reference[1])))
        held = max(worst) <= tolerance
        failed += not held
        say(f"| batched ({place}) | {tolerance:.0e} | {worst[0]:.1e} | {worst[1]:.1e} | {'yes' if held else 'NO'} |")
    return 1 if failed else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=["solvers", "workload", "accuracy"])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--sizes", default="128,256,512")
    parser.add_argument("--matrices", type=int, default=2048, help="per batched call (at most cuSOLVER's limit)")
    parser.add_argument("--loop", type=int, default=64, help="matrices for torch's looping eigvalsh")
    parser.add_argument("--samples", type=int, default=None, help="sequences (workload 10000, accuracy 16)")
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--dtype", default="float16", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--spectrum-device", default="cuda", choices=["auto", "cpu", "same", "cuda"])
    parser.add_argument("--tolerance", type=float, default=batched.FLOAT64_TOLERANCE)
    parser.add_argument("--init", type=float, default=0.06, help="std of the random weights")
    parser.add_argument("--encoder", default="random", choices=["random", "real"],
                        help="workload: the random RoBERTa-base-shaped encoder, or --model's real weights")
    parser.add_argument("--model", default=".gpu/minilm16")
    parser.add_argument("--data", default=".gpu/corpus.txt")
    args = parser.parse_args()
    if args.samples is None:
        args.samples = 10_000 if args.part == "workload" else 16
    if args.device == "cpu" and args.spectrum_device == "cuda":
        args.spectrum_device = "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    if args.part == "solvers":
        solvers(args)
    elif args.part == "workload":
        workload(args)
    else:
        sys.exit(accuracy(args))


if __name__ == "__main__":
    main()
