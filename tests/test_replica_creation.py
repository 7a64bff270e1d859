"""New replicas' logs are created in a worker thread, so a broker applying thousands of
new partitions at once keeps answering: the real PartitionManager on a real directory,
driven by metadata images as the broker drives it."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from pathlib import Path

from straitmq.broker import partitions as partitions_module
from straitmq.broker.partitions import PartitionManager
from straitmq.broker.record_codec import build_batch
from straitmq.broker.records import validate_batches
from straitmq.broker.storage import flusher
from straitmq.metadata.image import MetadataImage

ME = 1


def image_with(topics: dict[str, int]) -> MetadataImage:
    img = MetadataImage(cluster_id="c")
    img.apply(
        {
            "type": "register_broker",
            "id": ME,
            "incarnation": "i",
            "host": "h",
            "port": 1,
            "http_port": 2,
        }
    )
    for name, n in topics.items():
        img.apply({"type": "topic", "name": name, "topic_id": str(uuid.uuid4())})
        for i in range(n):
            img.apply(
                {
                    "type": "partition",
                    "topic": name,
                    "index": i,
                    "replicas": [ME],
                    "isr": [ME],
                    "leader": ME,
                }
            )
    return img


async def settle(pm: PartitionManager) -> None:
    for _ in range(2000):
        if not pm._creating and (pm._creator is None or pm._creator.done()):
            return
        await asyncio.sleep(0.005)
    raise AssertionError("replica creation did not finish")


def test_new_replicas_are_created_off_the_event_loop(tmp_path: Path, monkeypatch) -> None:
    threads: set[str] = set()
    real = partitions_module._make_logs

    def spy(todo):
        threads.add(threading.current_thread().name)
        return real(todo)

    monkeypatch.setattr(partitions_module, "_make_logs", spy)

    async def go() -> None:
        pm = PartitionManager(str(tmp_path), {}, ME)
        img = image_with({"big": 600})
        pm.sync(img)
        # Nothing was created inline: the sync returned at once, the worker creates.
        assert not pm.partitions and len(pm._creating) == 600
        # What CreateTopics waits for before answering: this broker's replicas are open.
        await pm.created("big", 60)
        assert len(pm.partitions) == 600 and all(p.is_leader for p in pm.partitions.values())
        assert threading.main_thread().name not in threads
        topic_id = str(img.topics["big"].topic_id)
        assert (tmp_path / "big-599" / ".topic-id").read_text() == topic_id
        batch = memoryview(build_batch([(None, b"kept", [])], 1_700_000_000_000))
        pm.partitions[("big", 7)].append(batch, validate_batches(batch, 1 << 20))
        pm.close()
        # A restarted broker loads its logs before its first sync (preopen, in a worker),
        # and that sync opens them all inline: nothing to create.
        pm2 = PartitionManager(str(tmp_path), {}, ME)
        await pm2.preopen(img)
        pm2.sync(img)
        assert len(pm2.partitions) == 600 and not pm2._creating
        assert pm2.partitions[("big", 7)].log.log_end_offset == 1
        pm2.close()
        # A log on disk that was not preloaded is opened by the worker, not recreated.
        pm3 = PartitionManager(str(tmp_path), {}, ME)
        pm3.sync(img)
        await pm3.created("big", 60)
        assert len(pm3.partitions) == 600
        assert pm3.partitions[("big", 7)].log.log_end_offset == 1
        pm3.close()

    asyncio.run(go())


def test_a_topic_deleted_while_its_logs_are_created_leaves_nothing(tmp_path: Path) -> None:
    async def go() -> None:
        pm = PartitionManager(str(tmp_path), {}, ME)
        img = image_with({"gone": 300, "kept": 3})
        pm.sync(img)
        img.apply({"type": "remove_topic", "name": "gone"})
        pm.sync(img, {"gone"})
        await settle(pm)
        assert sorted(pm.partitions) == [("kept", i) for i in range(3)]
        assert flusher.drain(30)  # the removed replicas' folders go in its thread
        assert sorted(os.listdir(tmp_path)) == ["kept-0", "kept-1", "kept-2"]
        pm.close()

    asyncio.run(go())


def test_a_replica_that_cannot_be_created_is_reported_not_retried_in_a_loop(
    tmp_path: Path, monkeypatch
) -> None:
    calls = []
    real = partitions_module._make_logs

    def counted(todo):
        calls.append(len(todo))
        return real(todo)

    monkeypatch.setattr(partitions_module, "_make_logs", counted)

    real_check = PartitionManager._check_owner

    def full_disk(path: str, topic_id: str) -> None:
        if path.endswith("t-1"):
            raise OSError(28, "No space left on device")
        real_check(path, topic_id)

    monkeypatch.setattr(PartitionManager, "_check_owner", staticmethod(full_disk))

    async def go() -> None:
        pm = PartitionManager(str(tmp_path), {}, ME)
        img = image_with({"t": 2})
        pm.sync(img)
        await settle(pm)
        assert ("t", 0) in pm.partitions and ("t", 1) not in pm.partitions
        assert "No space left" in (pm.storage_error("t", 1) or "")
        for _ in range(20):  # no retry loop in the background
            await asyncio.sleep(0.01)
        assert calls == [2] and not pm._creating
        pm.close()

    asyncio.run(go())


def test_leader_epoch_checkpoints_of_a_mass_leader_change_are_written_after_the_sync(
    tmp_path: Path, monkeypatch
) -> None:
    """A broker taking over leadership of thousands of partitions writes one epoch
    checkpoint file each: those writes happen after the sync, a slice of the loop at a
    time, not inside the metadata callback; a clean close writes what is left."""
    from straitmq.broker.storage.epochs import LeaderEpochCache

    writes = {"during_sync": 0, "all": 0}
    in_sync = False
    real_write = LeaderEpochCache._write

    def counting(self):
        writes["all"] += 1
        if in_sync:
            writes["during_sync"] += 1
        real_write(self)

    monkeypatch.setattr(LeaderEpochCache, "_write", counting)

    def lead_all(img: MetadataImage, leader: int) -> None:
        for i in range(300):
            img.apply({"type": "partition_change", "topic": "t", "index": i, "leader": leader})

    def on_disk(i: int) -> str:
        return (tmp_path / f"t-{i}" / "leader-epoch-checkpoint").read_text()

    async def go() -> None:
        nonlocal in_sync
        pm = PartitionManager(str(tmp_path), {}, ME)
        img = image_with({"t": 300})
        pm.sync(img)
        await settle(pm)
        lead_all(img, 2)  # another broker leads (epoch 1), then this one again (epoch 2)
        pm.sync(img, {"t"})
        lead_all(img, ME)
        in_sync = True
        pm.sync(img, {"t"})
        in_sync = False
        assert writes["during_sync"] == 0
        assert all(p.is_leader and p.log.epochs.latest_epoch == 2 for p in pm.partitions.values())
        assert pm._epoch_writer is not None
        await pm._epoch_writer
        assert all(on_disk(i).endswith("2 0\n") for i in range(300))
        # Written later still means written: a clean close flushes the rest.
        lead_all(img, 2)
        pm.sync(img, {"t"})
        lead_all(img, ME)
        pm.sync(img, {"t"})
        pm.close()
        assert all(on_disk(i).endswith("4 0\n") for i in range(300))

    asyncio.run(go())


def test_a_change_naming_many_topics_is_applied_after_the_callback(tmp_path: Path) -> None:
    """A metadata change naming many topics at once (a broker taking over another's
    leaderships) reaches the replicas in slices of the event loop, not inside the
    metadata callback; CreateTopics' wait (`created`) covers topics not synced yet."""

    async def go() -> None:
        pm = PartitionManager(str(tmp_path), {}, ME)
        names = {f"t{i}": 2 for i in range(60)}
        img = image_with(names)
        pm.sync(img)
        await settle(pm)
        for name in names:
            for i in range(2):
                img.apply({"type": "partition_change", "topic": name, "index": i, "leader": 2})
        pm.sync_soon(img, set(names))
        # Nothing yet: the callback returned at once.
        assert all(p.is_leader for p in pm.partitions.values())
        await pm.created("t59", 10)
        assert not pm.partitions[("t59", 0)].is_leader and not pm.partitions[("t59", 1)].is_leader
        assert pm._syncer is not None
        await pm._syncer
        assert not any(p.is_leader for p in pm.partitions.values())
        # A small change goes in at once, as before.
        img.apply({"type": "partition_change", "topic": "t0", "index": 0, "leader": ME})
        pm.sync_soon(img, {"t0"})
        assert pm.partitions[("t0", 0)].is_leader
        pm.close()

    asyncio.run(go())


def test_a_restarted_brokers_first_sync_runs_in_slices_and_sweeps_only_after_it(
    tmp_path: Path, monkeypatch
) -> None:
    """sync_all takes up the preloaded replicas a slice of the loop at a time (the loop
    turns meanwhile), keeps what they hold, and only then deletes what the image no
    longer names; a partial sync before it (a creation) never sweeps."""
    monkeypatch.setattr(partitions_module, "SYNC_SLICE_S", 0.0)  # one topic per slice

    async def go() -> None:
        img = image_with({**{f"t{n}": 5 for n in range(40)}, "old": 1})
        pm = PartitionManager(str(tmp_path), {}, ME)
        pm.sync(img)
        await pm.created("t39", 60)
        await pm.created("old", 60)
        batch = memoryview(build_batch([(None, b"kept", [])], 1_700_000_000_000))
        for n in range(40):
            pm.partitions[(f"t{n}", 4)].append(batch, validate_batches(batch, 1 << 20))
        pm.close()
        img.apply({"type": "remove_topic", "name": "old"})  # deleted while it was down
        assert (tmp_path / "old-0").is_dir()

        # Not preloaded, then a partial sync (another topic's creation) before the first
        # full one: the sweep must wait, or these logs would be deleted as unknown.
        pm2 = PartitionManager(str(tmp_path), {}, ME)
        img.apply({"type": "topic", "name": "new", "topic_id": str(uuid.uuid4())})
        img.apply(
            {
                "type": "partition",
                "topic": "new",
                "index": 0,
                "replicas": [ME],
                "isr": [ME],
                "leader": ME,
            }
        )
        pm2.sync(img, {"new"})
        await pm2.created("new", 60)
        assert all((tmp_path / f"t{n}-4").is_dir() for n in range(40))
        assert (tmp_path / "old-0").is_dir()
        pm2.close()

        pm3 = PartitionManager(str(tmp_path), {}, ME)
        await pm3.preopen(img)
        turns = 0
        done = False

        async def ticker() -> None:
            nonlocal turns
            while not done:
                turns += 1
                await asyncio.sleep(0)

        tick = asyncio.get_running_loop().create_task(ticker())
        await pm3.sync_all(img)
        done = True
        await tick
        assert turns >= 40  # a slice per topic, the loop turning between them
        assert len(pm3.partitions) == 201 and not pm3._preopened
        assert all(pm3.partitions[(f"t{n}", 4)].log.log_end_offset == 1 for n in range(40))
        assert not (tmp_path / "old-0").exists()  # swept once the first sync was done
        pm3.close()

    asyncio.run(go())


def test_a_removed_replicas_folder_is_deleted_off_the_event_loop(
    tmp_path: Path, monkeypatch
) -> None:
    """Topic deletion: the replica's folder is renamed away at once (a topic of the same
    name may come back) and its files are deleted in the flusher thread, not on the
    event loop, which never waits for that thread (a close would: producer snapshot,
    drain)."""
    threads: list[str] = []
    real = flusher.shutil.rmtree

    def spy(path: str, *args: object, **kwargs: object) -> None:
        threads.append(threading.current_thread().name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(flusher.shutil, "rmtree", spy)

    real_drain = flusher.drain
    removing = False

    def drain(timeout: float | None = None) -> bool:
        assert not removing, "a removed replica's log must not wait for the flusher"
        return real_drain(timeout)

    monkeypatch.setattr("straitmq.broker.storage.log.drain", drain)

    async def go() -> None:
        nonlocal removing
        pm = PartitionManager(str(tmp_path), {}, ME)
        img = image_with({"gone": 2, "kept": 1})
        pm.sync(img)
        await settle(pm)
        batch = memoryview(build_batch([(None, b"x" * 100, [])], 1_700_000_000_000))
        pm.partitions[("gone", 0)].append(batch, validate_batches(batch, 1 << 20))
        img.apply({"type": "remove_topic", "name": "gone"})
        removing = True
        pm.sync(img, {"gone"})
        removing = False
        assert sorted(pm.partitions) == [("kept", 0)]
        assert not os.path.exists(tmp_path / "gone-0")  # gone from its name at once
        assert flusher.drain(30)
        assert sorted(os.listdir(tmp_path)) == ["kept-0"]
        assert threads and all(t.startswith("segment-flush") for t in threads)
        # A topic of the same name gets a fresh folder.
        img2 = image_with({"gone": 1})
        pm.sync(img2, {"gone"})
        await settle(pm)
        assert pm.partitions[("gone", 0)].log.log_end_offset == 0
        pm.close()

    asyncio.run(go())


def test_retention_lets_the_event_loop_run_between_partitions(tmp_path: Path, monkeypatch) -> None:
    """The retention walk over every led partition yields to the loop (here after every
    64 partitions: a zero slice) instead of holding it for the whole walk."""
    monkeypatch.setattr(partitions_module, "RETENTION_SLICE_S", 0.0)

    async def go() -> None:
        pm = PartitionManager(str(tmp_path), {}, ME)
        pm.sync(image_with({"many": 300}))
        await settle(pm)
        turns = 0

        async def other() -> None:
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(other())
        await asyncio.sleep(0)
        before = turns
        assert await pm.apply_retention() == 0
        task.cancel()
        assert turns - before >= 300 // 64  # ran between slices of the walk
        pm.close()

    asyncio.run(go())
