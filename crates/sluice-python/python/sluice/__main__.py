"""``python -m sluice publish package.module:make_loader --topic T --epochs N``: runs a
data loader as a producer process of its own (see :func:`sluice.publish`).

``make_loader`` is called once, without arguments, and returns the loader: anything
iterated again for each epoch, such as a ``torch.utils.data.DataLoader``. With
``--resumable`` trainers whose saved state the topic no longer holds call it again to
catch up (see :func:`sluice.publish`'s ``resumable``)."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any, Callable

import sluice


def _factory(spec: str) -> Callable[[], Any]:
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise SystemExit(f"expected package.module:function, not {spec!r}")
    sys.path.insert(0, "")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise SystemExit(f"cannot load {spec}: {e}") from e
    if not callable(found):
        raise SystemExit(f"{spec} is not a function that makes a loader")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluice")
    commands = parser.add_subparsers(dest="command", required=True)
    publish = commands.add_parser("publish", help="publish what a data loader yields on a topic")
    publish.add_argument("loader", help="package.module:function that returns the loader")
    publish.add_argument("--topic", required=True)
    publish.add_argument("--epochs", type=int, default=1)
    publish.add_argument("--min-subscribers", type=int, default=None)
    publish.add_argument("--wait-timeout", type=float, default=None)
    publish.add_argument("--linger", type=float, default=10.0)
    publish.add_argument("--window", type=int, default=None)
    publish.add_argument("--max-subscribers", type=int, default=None)
    publish.add_argument("--max-held", type=int, default=None)
    publish.add_argument("--lag-limit", type=int, default=None)
    publish.add_argument(
        "--device",
        default=None,
        help="cpu (the default), cuda:N (the producer's device slots on GPU N) or cuda_host:N",
    )
    publish.add_argument(
        "--resumable",
        action="store_true",
        help="the loader yields the same batches for an epoch in any process: trainers "
        "catch up by making it again",
    )
    args = parser.parse_args(argv)
    make = _factory(args.loader)
    factory = None
    if args.resumable:
        try:
            factory = sluice.loader._factory_name(make)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    loader = make()
    try:
        sluice.loader._check_loader(loader, args.epochs)
    except (TypeError, ValueError) as e:
        print(f"error: {args.loader}() returned what cannot be published: {e}", file=sys.stderr)
        return 2
    batches, rows = sluice.loader._epoch_size(loader)
    # Bad settings are the command line's errors (exit 2); what the loader raises, a
    # ValueError too, propagates from its run below with its traceback.
    try:
        feeder = sluice.loader.Feeder(
            args.topic,
            factory=factory,
            epoch_batches=batches,
            epoch_rows=rows,
            epochs=args.epochs,
            window=args.window,
            max_subscribers=args.max_subscribers,
            max_held=args.max_held,
            lag_limit=args.lag_limit,
            device=args.device,
            min_subscribers=args.min_subscribers,
            wait_timeout=args.wait_timeout,
            linger=args.linger,
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except sluice.SluiceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    try:
        stats = sluice.loader._feed(feeder, loader, args.epochs)
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
        return 130
    except sluice.SluiceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"published {stats.rows} rows in {stats.batches} batches over {stats.epochs} epoch(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
