"""One data-parallel rank of tests/python/test_speculators_ranks_stop.py: the drop-in's loaders driven
as speculators' trainer drives them (its BatchRecoveryCoordinator, synchronised when its trainer
does), with a collective every step as DDP has. Prints one line per step; exits 3 when the
coordinator's circuit breaker stops the run, 0 when the epoch ends.

usage: rank_stop_worker.py RANK WORLD_SIZE PORT DATA_PATH ENDPOINT
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from speculators.train import distributed as dist_state
from speculators.train.recovery import BatchRecoveryCoordinator
from speculators.train.trainer import _should_sync_recovery

from draftfeed.speculators import create_train_val_loaders


def main() -> int:
    rank, world_size, port, data_path, endpoint = sys.argv[1:6]
    os.environ.update(RANK=rank, WORLD_SIZE=world_size)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=int(rank),
                            world_size=int(world_size), timeout=timedelta(seconds=60))
    # What speculators' maybe_setup_distributed() records after its init_process_group, which
    # needs an accelerator: the trainer's topology state, so that its coordinator synchronises.
    dist_state._is_distributed = True
    dist_state._rank, dist_state._world_size = int(rank), int(world_size)
    dist_state._init_sp_process_groups(int(rank), int(world_size), 1)
    train, _ = create_train_val_loaders(
        data_path=data_path, total_seq_len=96, hidden_states_dtype=torch.bfloat16, transfer=None,
        vllm_endpoint=endpoint, on_missing="generate", verifier_name_or_path=None,
        request_timeout=10.0, max_retries=0, generation_validation_retries=0,
        max_consecutive_generation_failures=3, hidden_size=16, num_target_layers=3, num_workers=1,
        prefetch_factor=2, preprocess=None, train_data_ratio=0.9, seed=42,
    )
    recovery = BatchRecoveryCoordinator("training", device=torch.device("cpu"))
    steps = len(train)
    start = time.monotonic()
    try:
        for step, batch in enumerate(train, 1):
            assert batch is not None
            recovery.consume(batch, synchronize=_should_sync_recovery(step, steps))
            grads = torch.ones(1)
            dist.all_reduce(grads)  # the step's gradient all-reduce
            print(f"step {step}/{steps}", flush=True)
    except RuntimeError as error:
        if "circuit breaker" not in str(error):
            raise
        print(f"STOPPED after {time.monotonic() - start:.1f} s: {error}", flush=True)
        dist.destroy_process_group()
        return 3
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
