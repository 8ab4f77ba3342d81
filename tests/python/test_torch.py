"""The PyTorch adapter (only where torch is installed: it is ~3 GB, CI does not install it)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip(
    "torch", reason="torch is not installed (~3 GB with CUDA); the CPU path is tested with numpy"
)

import sluice  # noqa: E402
import sluice.torch  # noqa: E402


def test_the_dataset_yields_one_epoch_per_pass_as_tensors(plans):
    producer = sluice.Producer(plans.plan(rows=230, batch_rows=50, epochs=2), min_subscribers=1)
    ds = sluice.torch.IterableDataset(plans.topic, batch_size=64, timeout=30,
                                      columns=["id", "vec", "text"])
    loader = torch.utils.data.DataLoader(ds, batch_size=None)
    passes = []
    for _ in range(3):
        ids = []
        for batch in loader:
            assert batch["vec"].shape[1:] == (4,) and batch["vec"].dtype == torch.float32
            assert len(batch["text"]) == len(batch["id"])
            ids += batch["id"].tolist()
        passes.append(sorted(ids))
    assert passes == [list(range(230)), list(range(230)), []]
    assert ds.last_epoch.epoch == 1 and ds.last_epoch.complete
    ds.close()
    producer.wait(timeout=30)
