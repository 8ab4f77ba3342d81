"""A minimal trainer: linear regression on a Sluice topic, with numpy (or torch).

Run it against a producer that publishes ``features`` (a fixed-size list of floats) and
``target`` (a float), for example the one ``two_trainers.py`` starts::

    python examples/python/trainer.py --topic regression --batch-size 64
    python examples/python/trainer.py --topic regression --batch-size 64 --torch

The features arrive as a read-only 2-D numpy array viewing shared memory
(``np.from_dlpack``); nothing is copied until the model computes with them.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

import sluice


def train_numpy(sub: sluice.Subscriber, lr: float) -> list[dict]:
    w = None
    report = []
    for epoch in sub.epochs():
        loss_sum, rows = 0.0, 0
        for batch in epoch:
            x = np.from_dlpack(batch["features"])  # (n, d) float32, zero-copy
            y = np.from_dlpack(batch["target"])  # (n,) float32, zero-copy
            if w is None:
                w = np.zeros(x.shape[1], dtype=np.float32)
            err = x @ w - y
            w -= lr * (x.T @ err) / len(y)
            loss_sum += float(err @ err)
            rows += len(y)
        report.append(
            {"epoch": epoch.epoch, "rows": epoch.rows, "complete": epoch.complete,
             "mse": loss_sum / max(rows, 1)}
        )
    return report


def train_torch(sub: sluice.Subscriber, lr: float) -> list[dict]:
    import torch

    model = None
    report = []
    for epoch in sub.epochs():
        loss_sum, rows = 0.0, 0
        for batch in epoch:
            # The unversioned DLPack capsule: a CPU tensor over shared memory (read-only use).
            x = torch.from_dlpack(batch["features"].__dlpack__())
            y = torch.from_dlpack(batch["target"].__dlpack__())
            if model is None:
                model = torch.nn.Linear(x.shape[1], 1, bias=False)
                opt = torch.optim.SGD(model.parameters(), lr=lr)
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
            loss.backward()
            opt.step()
            loss_sum += float(loss) * len(y)
            rows += len(y)
        report.append(
            {"epoch": epoch.epoch, "rows": epoch.rows, "complete": epoch.complete,
             "mse": loss_sum / max(rows, 1)}
        )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topic", default="regression")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--torch", action="store_true", help="train with torch (if installed)")
    parser.add_argument("--name", default="trainer")
    args = parser.parse_args(argv)

    use_torch = False
    if args.torch:
        try:
            import torch  # noqa: F401

            use_torch = True
        except ImportError:
            print(f"{args.name}: torch is not installed; using numpy", file=sys.stderr)

    with sluice.subscribe(args.topic, batch_size=args.batch_size, timeout=args.timeout) as sub:
        report = (train_torch if use_torch else train_numpy)(sub, args.lr)
    for line in report:
        print(json.dumps({"trainer": args.name, "batch_size": args.batch_size, **line}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
