"""How a training command ends: the model saved where DPO and evaluation read it, then a last barrier across the
processes that keeps every rank alive until the main process has written, and the process groups ended cleanly.

`trl_emo.sft`, `trl_emo.dpo` and `trl_emo.grpo` end with `end_run(trainer)`; a script of one's own that trains under
`accelerate launch` should too (`docs/distributed.md`, "Ending a run").
"""

from __future__ import annotations

# The last barrier of a distributed command; see `end_run`.
_FINAL_BARRIERS: list = []


def end_run(trainer) -> None:
    """End a training command: a last barrier across the processes, then the process groups are destroyed.

    Under `accelerate launch` with gloo (CPU DDP, FSDP2, DeepSpeed) a rank used to abort at exit ("terminate called
    without an active exception", SIGABRT; 7 runs in 40 of the shipped ZeRO-3 config on 2 CPU processes). The core
    dump shows why: a gloo worker thread drops the last reference to a finished collective (here `AsyncAllgatherWork`,
    in `ProcessGroupGloo::runLoop`) a moment after the main thread has returned from waiting on it, and freeing that
    collective's tensors needs the GIL; when the main thread has reached interpreter shutdown by then, the worker
    thread is killed inside a destructor. `destroy_process_group` does not stop those threads (DeepSpeed and
    accelerate still hold the groups). A plain barrier moves the problem to the barrier, which keeps every unfinished
    collective alive until the worker frees it. So this barrier's handle is kept for the life of the process: the
    worker thread then only drops a reference, which needs no GIL, and the objects are freed on the main thread.
    The barrier also keeps any rank from exiting before the main process has written the model."""
    if not final_barrier():
        trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()


def final_barrier() -> bool:
    """Wait for every process at the end of a command and keep the barrier's handle (see `end_run`); False when
    there is no torch.distributed process group to wait on."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return False
    barrier = dist.barrier(async_op=True)
    barrier.wait()
    _FINAL_BARRIERS.append(barrier)
    return True


def save_outputs(trainer, output_dir: str) -> None:
    """Save the model (or adapter), tokenizer and generation config where DPO and evaluation will read them."""
    trainer.save_model(output_dir)
    if trainer.accelerator.is_main_process:
        model = trainer.accelerator.unwrap_model(trainer.model)
        # An adapter folder gets the generation config too, so the end-of-turn EOS survives merging.
        model.generation_config.save_pretrained(output_dir)
