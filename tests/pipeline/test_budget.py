"""A rank's share of the cluster (``raypipe.pipeline.budget``): pure functions, tested without Ray."""

import pytest

from raypipe.pipeline.budget import rank_budget


def test_ranks_budgets_add_up_to_the_cluster_not_a_multiple_of_it():
    one = rank_budget(eligible_cpus=32, reserved_cpus=8, world_size=1, cpus_per_task=0.5, prefetch_chunks=2)
    assert one.workers == 48 and one.in_flight == 50
    two = [
        rank_budget(eligible_cpus=32, reserved_cpus=8, world_size=2, cpus_per_task=0.5, prefetch_chunks=2)
        for _ in range(2)
    ]
    assert sum(b.workers for b in two) == one.workers
    tiny = rank_budget(eligible_cpus=2, reserved_cpus=2, world_size=4, cpus_per_task=0.5, prefetch_chunks=0)
    assert tiny.workers == 1  # a rank always progresses
    fixed = rank_budget(
        eligible_cpus=64, reserved_cpus=0, world_size=8, cpus_per_task=1, prefetch_chunks=1, num_tasks=3
    )
    assert (fixed.workers, fixed.in_flight) == (3, 4)


@pytest.mark.parametrize("cores", [2, 16, 48, 96])
@pytest.mark.parametrize("cpus_per_task", [1.0, 0.5])
def test_a_ranks_share_leaves_no_core_idle_and_asks_for_no_more_than_the_share(cores, cpus_per_task):
    """Fractional reservations never idle a whole core: for 1-8 ranks, each holding nothing, a
    feeder's 0.25, or a trainer's CPUs and a feeder's, the ranks' tasks together ask for their share,
    within half a task of it, and never for more than the node has left."""
    shapes = [(ranks, held) for ranks in range(1, 9) for held in (0.0, 0.25, 1.25, 4.25) if held * ranks < cores]
    assert len(shapes) >= 16
    for ranks, held_per_rank in shapes:
        _check_shares(cores, ranks, held_per_rank * ranks, cpus_per_task)


def _check_shares(cores: int, ranks: int, reserved: float, cpus_per_task: float) -> None:
    budgets = [
        rank_budget(
            eligible_cpus=cores,
            reserved_cpus=reserved,
            world_size=ranks,
            cpus_per_task=cpus_per_task,
            prefetch_chunks=2,
        )
        for _ in range(ranks)
    ]
    share = (cores - reserved) / ranks
    for b in budgets:
        asked = b.workers * b.task_cpus
        assert asked <= share + 1e-9, (b, share)  # fits beside what the trainers hold
        assert b.task_cpus <= cpus_per_task
        assert share - asked <= cpus_per_task / 2 + 1e-3, (b, share)  # never a whole task's CPUs idle
        assert b.task_cpus == round(b.task_cpus, 4)  # in steps Ray can hold
    assert sum(b.workers * b.task_cpus for b in budgets) <= cores - reserved + 1e-9


def test_a_feeders_quarter_core_on_two_cores_runs_two_tasks():
    """The README's API on a 2-core machine: 2 CPUs less the feeder's 0.25 is two tasks, not one."""
    b = rank_budget(eligible_cpus=2, reserved_cpus=0.25, world_size=1, cpus_per_task=1.0, prefetch_chunks=2)
    assert (b.workers, b.task_cpus, b.in_flight) == (2, 0.875, 4)
    # a share just over one task's rounds down, and that task asks for what it was sized for
    b = rank_budget(eligible_cpus=2, reserved_cpus=0.6, world_size=1, cpus_per_task=1.0, prefetch_chunks=0)
    assert (b.workers, b.task_cpus) == (1, 1.0)
    # nothing left over (the trainers hold every CPU): one task, at its full size, which waits for a CPU
    b = rank_budget(eligible_cpus=4, reserved_cpus=4, world_size=2, cpus_per_task=1.0, prefetch_chunks=0)
    assert (b.workers, b.task_cpus) == (1, 1.0)


def test_a_cpu_node_with_a_preprocess_resource_is_shared_by_the_ranks_it_feeds():
    """CPU-only preprocessing nodes (3 x 48 cores, nothing reserved on them) over 8 GPU ranks: 18
    tasks each, of a whole core; with 7 ranks the 20.57 CPUs each are 21 tasks of 0.9795."""
    b = rank_budget(eligible_cpus=144, reserved_cpus=0, world_size=8, cpus_per_task=1.0, prefetch_chunks=2)
    assert (b.workers, b.task_cpus) == (18, 1.0)
    b = rank_budget(eligible_cpus=144, reserved_cpus=0, world_size=7, cpus_per_task=1.0, prefetch_chunks=2)
    assert (b.workers, b.task_cpus) == (21, 0.9795)


def test_chunks_in_flight_fit_the_ranks_share_of_the_object_store():
    kw = dict(eligible_cpus=64, reserved_cpus=0, cpus_per_task=0.5, prefetch_chunks=2)
    roomy = rank_budget(world_size=2, store_bytes=100e9, chunk_bytes=20_000_000, **kw)
    assert (roomy.workers, roomy.in_flight) == (64, 66)
    tight = rank_budget(world_size=2, store_bytes=4e9, chunk_bytes=20_000_000, **kw)  # 1 GB each = 50 chunks
    assert tight.in_flight == 50 and tight.workers == 50
    assert rank_budget(world_size=2, store_bytes=1e6, chunk_bytes=20_000_000, **kw).in_flight == 1
