"""Mutation checking: deliberate breakages of the template, one at a time, each run against the
tests that should notice it. Not part of `make test`; run it before each release.

    make mutants                          # every mutant
    .venv/bin/python tests/mutants.py -k amp      # those whose name or what it breaks says amp
    .venv/bin/python tests/mutants.py --list      # the list, with the tests of each
    .venv/bin/python tests/mutants.py --check     # only that every mutant still applies

For each mutant, what the tests read (copier.yml, template/, hooks/, examples/, tests/,
pyproject.toml, README.md) is copied to a temporary folder and one change is made there: a
piece of text replaced by another. The text must occur exactly as often as the mutant says,
so a mutant that no longer applies after the code changed is an error, never a silent pass.
Then the mutant's tests run on the copy (TEMPLATE_HISTORY names this repository, whose git
history the upgrade matrix needs). Caught: they fail. Missed: they pass, and a test is
missing. The script prints a line per mutant, the score and the slowest mutant, and exits 1
unless every mutant applied and was caught.

Each technique of the generated project and each guarantee of the README has at least one
mutant; add one with every new technique. The tests named here are the ones expected to
notice, but they check behaviour, not the mutant: a mutant that a test catches only by
accident of its wording is a mutant to rewrite.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COPIED = ("copier.yml", "pyproject.toml", "README.md", "template", "hooks", "examples", "tests")
PKG = "template/{{package_name}}"
TRAIN = "template/train.py.jinja"
DATA = f"{PKG}/data.py.jinja"
UTILS = f"{PKG}/utils.py.jinja"
SCHEDULE = f"{PKG}/schedule.py.jinja"
FINDERS = PKG + "/{% if finders %}finders.py{% endif %}.jinja"
OPTIM = f"{PKG}/optim.py.jinja"
CHECKPOINT = f"{PKG}/checkpoint.py.jinja"
LOGGER = f"{PKG}/logger.py.jinja"
METRICS = f"{PKG}/metrics.py.jinja"
GUARD = PKG + "/{% if guard %}guard.py{% endif %}.jinja"
PREEMPTION = PKG + "/{% if preemption %}preemption.py{% endif %}.jinja"
DEVICE_DATA = PKG + "/{% if device_data %}device_data.py{% endif %}.jinja"
DISTRIBUTED = PKG + "/{% if torchrun %}distributed.py{% endif %}.jinja"
LAMB = PKG + "/{% if optimizer == 'lamb' %}lamb.py{% endif %}"
LARS = PKG + "/{% if optimizer == 'lars' %}lars.py{% endif %}"
SLURM = "template/{% if torchrun %}scripts{% endif %}/slurm.sbatch.jinja"
LAUNCH = "template/{% if torchrun %}scripts{% endif %}/launch.sh.jinja"
SHARDING = PKG + "/{% if fsdp %}sharding.py{% endif %}.jinja"
SPEED = PKG + "/{% if speed_report %}speed.py{% endif %}.jinja"


@dataclass(frozen=True)
class Mutant:
    name: str
    breaks: str  # the technique or guarantee it breaks
    path: str
    old: str
    new: str
    tests: tuple[str, ...]  # pytest arguments: files, node ids, -k expressions
    occurrences: int = 1


# train.py: the logger (which puts back a missing metrics.csv) before a finished run's return.
LOGGER_LINE = (
    "    logger = MetricsLogger(out_dir{% if torchrun %} if rank == 0 else None{% endif %}, "
    "progress.history, progress.epoch)\n"
)
NOTHING_TO_DO = (
    "    if progress.epoch >= args.epochs:\n"
    '        print(f"nothing to do: {resume} is at epoch {progress.epoch} of {args.epochs}")\n'
    "        return\n"
)

MUTANTS = [
    # Schedules
    Mutant(
        "1cycle-ignores-accumulation",
        "1cycle: total steps from the loader length after accumulation",
        TRAIN,
        "math.ceil(len(batches) / args.accum_steps)",
        "len(batches)",
        ("tests/test_schedules.py",),
    ),
    Mutant(
        "short-run-ignores-accumulation",
        "the batch of a short run: optimizer steps count --accum-steps' windows",
        DATA,
        "return args.epochs * -(-(items // batch) // args.accum_steps)",
        "return args.epochs * (items // batch)",
        ("tests/test_schedules.py", "-k", "short_run"),
    ),
    Mutant(
        "short-run-below-32",
        "the batch of a short run: never below 32",
        DATA,
        "least = BATCH_SIZE, max(32, BATCH_SIZE // 4)",
        "least = BATCH_SIZE, BATCH_SIZE // 4",
        ("tests/test_schedules.py", "-k", "short_run"),
    ),
    Mutant(
        "short-run-resume-takes-a-new-batch",
        "the batch of a short run: a resumed run keeps the batch it began with",
        TRAIN,
        'saved = checkpoint["args"]["batch_size"] if checkpoint else None',
        "saved = None",
        ("tests/test_schedules.py", "-k", "short_run"),
    ),
    Mutant(
        "short-run-counts-every-process-items",
        "the batch of a short run: under DDP, a process's steps count its share of the data",
        TRAIN,
        "{% if torchrun %} // world_size{% endif %}",
        "",
        ("tests/test_ddp.py", "-k", "short_run"),
    ),
    Mutant(
        "ddp-as-one-process-misreads-a-single-checkpoint",
        "a DDP project run as one process resumes a single process's checkpoint",
        CHECKPOINT,
        "own = shares[rank()] if processes == process_count() else checkpoint",
        'own = checkpoint["processes"][rank()] if processes == process_count() else checkpoint',
        ("tests/test_ddp.py", "-k", "move_between"),
    ),
    Mutant(
        "out-dir-in-use-stops-rank-0-alone",
        "when another run holds --out-dir, every process of a torchrun job stops with one line",
        TRAIN,
        "    if problem := all_gather(holds and hold_out_dir(out_dir))[0]:  # every process stops",
        "    if problem := holds and hold_out_dir(out_dir):",
        ("tests/test_ddp.py", "-k", "out_dir_in_use"),
    ),
    Mutant(
        "ctrl-c-under-launch-sh-reaches-torchrun",
        "Ctrl-C under scripts/launch.sh checkpoints, stops and exits with 130",
        LAUNCH,
        "args+=(--signals-to-handle=SIGHUP,SIGQUIT)",
        "args+=(--signals-to-handle=SIGINT,SIGHUP,SIGQUIT)",
        ("tests/test_resume.py", "-k", "launch_sh and SIGINT"),
    ),
    Mutant(
        "ctrl-c-under-launch-sh-fails-torchrun",
        "Ctrl-C under scripts/launch.sh checkpoints, stops and exits with 130",
        PREEMPTION,
        '        if os.environ.get("REQUEUE_FILE"):',
        '        if os.environ.get("REQUEUE_FILE") and exit_code == REQUEUE_EXIT:',
        ("tests/test_resume.py", "-k", "launch_sh and SIGINT"),
    ),
    Mutant(
        "resume-refuses-the-defaults-of-flags-left-out",
        "a resume goes on with the checkpoint's held flags that the command leaves out",
        CHECKPOINT,
        '    for flag in {"seed", *([] if restart else STATE_FLAGS)} - given:',
        '    for flag in {"seed"} - given:',
        ("tests/test_robustness.py", "-k", "leaves_out"),
    ),
    Mutant(
        "resume-keeps-the-seed-default-left-out",
        "a resume goes on with the checkpoint's --seed where the command leaves it out",
        CHECKPOINT,
        '    for flag in {"seed", *([] if restart else STATE_FLAGS)} - given:',
        "    for flag in {*([] if restart else STATE_FLAGS)} - given:",
        ("tests/test_robustness.py", "-k", "leaves_out"),
    ),
    Mutant(
        "new-schedule-keeps-the-old-flags",
        "a new schedule (--more-epochs restart) takes new optimizer and schedule flags",
        CHECKPOINT,
        '    for flag in {"seed", *([] if restart else STATE_FLAGS)} - given:',
        '    for flag in {"seed", *STATE_FLAGS} - given:',
        ("tests/test_robustness.py", "-k", "leaves_out"),
    ),
    Mutant(
        "tensorboard-missing-is-a-traceback",
        "a missing tensorboard package stops the run in one line naming it",
        LOGGER,
        '            raise UserError("TensorBoard needs its package: pip install tensorboard")'
        " from None",
        "            raise",
        ("tests/test_robustness.py", "-k", "tensorboard_missing"),
    ),
    Mutant(
        "early-ctrl-c-under-launch-sh-is-lost",
        "a Ctrl-C under scripts/launch.sh before training began stops the run with 130",
        PREEMPTION,
        '                raise Stopped("interrupted before training began", exit_code=0)',
        "                pass",
        ("tests/test_resume.py", "-k", "launch_sh and before_training"),
    ),
    Mutant(
        "guard-blames-the-data-after-a-resume",
        "after a resume, the guard's stop does not say the first loss came before any update",
        GUARD,
        "        self.resumed = True\n",
        "",
        ("tests/test_data_mistakes.py", "-k", "from_a_resume"),
    ),
    Mutant(
        "token-ids-made-floats",
        "token ids (DataInfo.dtype int64) reach the model as they are",
        DATA,
        "        elif inputs.dtype != self.dtype:\n            inputs = inputs.to(self.dtype)",
        "        elif inputs.dtype != torch.float32:\n            inputs = inputs.float()",
        ("tests/test_in_memory.py", "-k", "token_ids"),
    ),
    Mutant(
        "model-check-tries-float-token-ids",
        "the model's check tries inputs of the data's dtype",
        f"{PKG}/models.py.jinja",
        "device=device, dtype=info.dtype))",
        "device=device))",
        ("tests/test_in_memory.py", "-k", "token_ids"),
    ),
    Mutant(
        "batch-size-search-tries-float-token-ids",
        "the batch-size search tries inputs of the data's dtype",
        FINDERS,
        "    data = inputs.to(info.dtype), targets  # as batches reach the model",
        "    data = inputs.float(), targets",
        ("tests/test_in_memory.py", "-k", "token_ids"),
    ),
    Mutant(
        "integer-dtype-with-a-mean-accepted",
        "a DataInfo with a mean and an integer dtype is refused",
        DATA,
        "    elif info.mean is not None and not info.dtype.is_floating_point:",
        "    elif False:",
        ("tests/test_in_memory.py", "-k", "token_ids"),
    ),
    Mutant(
        "validation-loader-draws-from-the-global-rng",
        "a run on the loader path with workers and dropout resumes bit for bit",
        DATA,
        "    val_options = dict(options, generator=torch.Generator().manual_seed(args.seed))",
        "    val_options = dict(options)",
        ("tests/test_in_memory.py", "-k", "workers_and_dropout"),
    ),
    Mutant(
        "batch-size-search-flattens-targets",
        "the batch-size search samples targets of every shape as the loader stacks them",
        FINDERS,
        "    return inputs, torch.stack([torch.as_tensor(y) for _, y in items])",
        "    return inputs, torch.as_tensor([y for _, y in items])",
        ("tests/test_finders.py", "-k", "every_shape"),
    ),
    Mutant(
        "torchvision-side-heads-kept",
        "googlenet and inception_v3 are built without their side heads",
        f"{PKG}/models.py.jinja",
        """    options = {"aux_logits": False} if name in ("googlenet", "inception_v3") else {}""",
        "    options = {}",
        ("tests/test_models.py", "-k", "side_heads"),
    ),
    Mutant(
        "named-terms-must-be-tensors",
        "compute_loss's named terms may be plain numbers",
        METRICS,
        "        terms = [torch.as_tensor(term, device=loss.device) for term in terms.values()]",
        "        terms = list(terms.values())",
        ("tests/test_metrics_history.py", "-k", "plain_numbers"),
    ),
    Mutant(
        "hint-after-lr-auto-says-try-auto",
        "a run whose lr --lr auto chose is told a rate to try, not the sweep again",
        SCHEDULE,
        "        self.swept = swept  # the lr is --lr auto's: a rate to try, not the sweep again",
        "        self.swept = False",
        ("tests/test_schedules.py", "-k", "lr_auto_names_a_rate"),
    ),
    Mutant(
        "help-without-defaults",
        "train.py --help gives each flag's default (the answers)",
        UTILS,
        '        return f"{action.help} (default: %(default)s)"',
        "        return action.help",
        ("tests/test_questions.py", "-k", "help_gives"),
    ),
    Mutant(
        "restarted-job-starts-over",
        "a job that torchrun restarts or SLURM requeues goes on from its own last.pt",
        TRAIN,
        '    if not args.eval_only and restarted_job(out_dir / "last.pt"):',
        "    if False:",
        ("tests/test_resume.py", "-k", "restarted_job"),
    ),
    Mutant(
        "restarted-job-takes-another-jobs-checkpoint",
        "a restarted job goes on from its own last.pt only, not another job's in its --out-dir",
        CHECKPOINT,
        'return last.is_file() and load_checkpoint(last).get("job") == job_id()',
        "return last.is_file()",
        ("tests/test_resume.py", "-k", "restarted_job"),
    ),
    Mutant(
        "resume-keeps-the-steps-of-another-batch",
        "a resume with other batches goes on from the same epoch of the schedule",
        TRAIN,
        "        if progress.batch == 0 and progress.epoch > progress.schedule_start:",
        "        if False:",
        ("tests/test_schedules.py", "-k", "same_epoch_of_the_schedule"),
    ),
    Mutant(
        "guard-limit-seen-only-at-host-syncs",
        "guard: --max-bad-steps in a row stop the run before a save, between host syncs too",
        CHECKPOINT,
        "    parts.guard.before_save(args.max_bad_steps, path.parent)\n",
        "",
        ("tests/test_robustness.py", "-k", "non_finite_losses_stop"),
    ),
    Mutant(
        "metrics-row-past-the-checkpoint-kept-aside",
        "metrics.csv one row past the checkpoint (a kill between the writes) is the run's own",
        LOGGER,
        "            written = ours\n",
        "            pass\n",
        ("tests/test_metrics_history.py", "-k", "row_past"),
    ),
    Mutant(
        "outputs-written-0600",
        "checkpoints and metrics.csv take the umask's mode, not the temporary file's 0600",
        UTILS,
        "os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)",
        "os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)",
        ("tests/test_metrics_history.py", "-k", "umask"),
    ),
    Mutant(
        "part-way-resume-takes-other-accumulation",
        "a checkpoint from part-way through an epoch resumes only with its --accum-steps",
        CHECKPOINT,
        "    per_step = args.batch_size, args.accum_steps",
        "    per_step = args.batch_size, args_saved.get('accum_steps', 1)",
        ("tests/test_resume.py", "-k", "part_way_epoch_resumes_only"),
    ),
    Mutant(
        "resume-takes-new-schedule-flags",
        "a resume that gives other schedule flags is refused, naming them",
        CHECKPOINT,
        "{%- set schedule_flags = {'warmup_cosine': warmup_flags + ['min_lr'],",
        "{%- set schedule_flags = {'warmup_cosine': [],",
        ("tests/test_robustness.py", "-k", "flags_a_resume_cannot_take"),
    ),
    Mutant(
        "restart-count-of-slurm-ignored",
        "a SLURM requeue is a restarted job too",
        CHECKPOINT,
        'names = ("SLURM_RESTART_COUNT",)',
        'names = ("SLURM_RESTART_COUNTS",)',
        ("tests/test_resume.py", "-k", "restarted_job"),
    ),
    Mutant(
        "preempted-fresh-run-says-the-same-command",
        "a preempted run started with --fresh says to run it again without --fresh",
        PREEMPTION,
        'given = "--fresh" if args.fresh else',
        "given = None if args.fresh else",
        ("tests/test_resume.py", "-k", "says_how_to_resume"),
    ),
    Mutant(
        "1cycle-fixed-pct-start",
        "1cycle: the warm-up share of the cycle",
        SCHEDULE,
        "        pct_start=pct_start,",
        "        pct_start=0.3,",
        ("tests/test_schedules.py", "-k", "onecycle"),
    ),
    Mutant(
        "cyclic-mode-ignored",
        "cyclical LR: triangular / triangular2 / exp_range",
        SCHEDULE,
        "mode=args.cyclic_mode,",
        'mode="triangular",',
        ("tests/test_schedules.py", "-k", "cyclic"),
    ),
    Mutant(
        "warmup-jumps",
        "warmup: linear, ending exactly at the peak",
        SCHEDULE,
        "return min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0",
        "return min(1.0, step / warmup) if warmup > 0 else 1.0",
        ("tests/test_schedules.py", "-k", "warmup"),
    ),
    Mutant(
        "cosine-without-floor",
        "cosine annealing to a floor (--min-lr)",
        SCHEDULE,
        "return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))",
        "return 0.5 * (1 + math.cos(math.pi * progress))",
        ("tests/test_schedules.py", "-k", "cosine"),
    ),
    Mutant(
        "restarts-same-length",
        "cosine with warm restarts: each cycle --restart-mult times longer",
        SCHEDULE,
        "position, length = position - length, length * mult",
        "position, length = position - length, length",
        ("tests/test_schedules.py", "-k", "restarts"),
    ),
    # Finders
    Mutant(
        "lr-finder-suggests-the-minimum",
        "LR finder: a tenth of the rate at the lowest smoothed loss",
        FINDERS,
        'return float(f"{lrs[lowest_step(smoothed)] / 10:.3g}")',
        'return float(f"{lrs[lowest_step(smoothed)]:.3g}")',
        ("tests/test_finders.py", "-k", "suggested_lr"),
    ),
    Mutant(
        "batch-finder-no-headroom",
        "batch-size finder: half the largest batch that fit",
        FINDERS,
        "batch_size = largest if failed is None else max(1, largest // 2)",
        "batch_size = largest",
        ("tests/test_finders.py", "-k", "memory_limit"),
    ),
    Mutant(
        "batch-finder-lr-not-scaled",
        "batch-size finder: the linear scaling rule for the learning rate",
        FINDERS,
        "        lr = args.lr * args.batch_size / reference",
        "        lr = args.lr",
        ("tests/test_finders.py", "-k", "memory_limit"),
    ),
    # Data loading
    Mutant(
        "workers-not-capped",
        "DataLoader workers capped by the CPUs",
        DATA,
        "workers = min(args.workers, cpu_count())",
        "workers = args.workers",
        ("tests/test_loading.py",),
    ),
    Mutant(
        "workers-not-persistent",
        "persistent workers and prefetching",
        DATA,
        "persistent_workers=workers > 0",
        "persistent_workers=False",
        ("tests/test_loading.py",),
    ),
    Mutant(
        "memory-always-pinned",
        "pinned memory on CUDA only",
        DATA,
        '"pin_memory": device.type == "cuda"',
        '"pin_memory": True',
        ("tests/test_loading.py",),
    ),
    Mutant(
        "in-memory-set-copied",
        "torch.as_tensor instead of torch.tensor: no needless copies",
        DATA,
        "images = torch.as_tensor(dataset.data)",
        "images = torch.tensor(dataset.data)",
        ("tests/test_device_data.py", "-k", "in_memory"),
    ),
    Mutant(
        "device-data-same-order-every-epoch",
        "on-device data: a new shuffle each epoch",
        DEVICE_DATA,
        "gen = torch.Generator(self.device).manual_seed(self.seed * 100_003 + self.epoch)\n"
        "        order",
        "gen = torch.Generator(self.device).manual_seed(self.seed * 100_003)\n        order",
        ("tests/test_device_data.py",),
    ),
    Mutant(
        "channels-last-ignored",
        "channels_last batches",
        DATA,
        "inputs = inputs.contiguous(memory_format=torch.channels_last)",
        "inputs = inputs.contiguous()",
        ("tests/test_device_data.py", "-k", "memory_format"),
    ),
    # Mixed precision and the training step
    Mutant(
        "fp16-clips-scaled-gradients",
        "AMP: unscale_ before clipping",
        TRAIN,
        "        parts.scaler.unscale_(parts.optimizer)  # clip the true gradients, not scaled "
        "ones\n",
        "",
        ("tests/test_training_step.py",),
    ),
    Mutant(
        "fp16-schedule-waits-for-skips",
        "AMP: the schedule counts the loop's steps, the GradScaler's skips too (exact resume)",
        TRAIN,
        "    parts.scaler.step(parts.optimizer)  # skipped when the scaled gradients overflowed\n"
        "    parts.scaler.update()\n"
        "    parts.scheduler.step()  # skipped or not: the schedule counts the loop's steps",
        "    scale = parts.scaler.get_scale()\n"
        "    parts.scaler.step(parts.optimizer)\n"
        "    parts.scaler.update()\n"
        "    if parts.scaler.get_scale() >= scale:  # the scale only drops after a skipped step\n"
        "        parts.scheduler.step()",
        ("tests/test_training_step.py", "-k", "scaler_skipped"),
    ),
    Mutant(
        "fp16-scaler-not-saved",
        "AMP: the GradScaler's state in checkpoints",
        CHECKPOINT,
        '        "scaler": parts.scaler.state_dict(),\n',
        "",
        ("tests/test_training_step.py",),
    ),
    Mutant(
        "no-clipping",
        "gradient clipping",
        TRAIN,
        "    if args.clip_grad > 0:\n",
        "    if args.clip_grad < 0:\n",
        ("tests/test_training_step.py", "-k", "clipped"),
        occurrences=2,
    ),
    Mutant(
        "accumulation-sums",
        "gradient accumulation: the window's mean",
        TRAIN,
        "{{ ind }}(loss / window if window > 1 else loss).backward()",
        "{{ ind }}loss.backward()",
        ("tests/test_training_step.py", "-k", "accumulated"),
    ),
    Mutant(
        "no-label-smoothing",
        "label smoothing",
        TRAIN,
        "F.cross_entropy(outputs, targets, label_smoothing=args.label_smoothing)",
        "F.cross_entropy(outputs, targets)",
        ("tests/test_training_step.py", "-k", "smoothing"),
    ),
    Mutant(
        "per-step-host-sync",
        "no needless host syncs: the host waits only at log intervals",
        TRAIN,
        "        parts.metrics.add(loss, terms)\n",
        "        parts.metrics.add(loss, terms)\n        loss.item()\n",
        ("tests/test_host_syncs.py",),
    ),
    Mutant(
        "model-not-compiled",
        "torch.compile",
        TRAIN,
        "model = torch.compile(raw_model) if args.compile else raw_model",
        "model = raw_model",
        ("tests/test_examples.py", "-k", "compiled"),
    ),
    # Optimizers
    Mutant(
        "decay-on-biases",
        "no weight decay on biases and normalisation parameters",
        OPTIM,
        "(no_decay if param.ndim <= 1 else decay).append(param)",
        "(no_decay if param.ndim < 1 else decay).append(param)",
        ("tests/test_rendered_suite.py",),
    ),
    Mutant(
        "never-fused",
        "fused optimizers where PyTorch has them",
        OPTIM,
        "return cls(groups, **options, fused=True)",
        "return cls(groups, **options, foreach=True)",
        ("tests/test_robustness.py", "-k", "leaves_model_and_optimizer"),
    ),
    Mutant(
        "lamb-trust-inverted",
        "LAMB: the trust ratio ||p|| / ||update||",
        LAMB,
        "trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, 1.0)",
        "trust = torch.where((w_norm > 0) & (u_norm > 0), u_norm / w_norm, 1.0)",
        ("tests/test_lamb_lars.py", "-k", "lamb"),
    ),
    Mutant(
        "lars-without-decay-term",
        "LARS: the local learning rate with the weight decay term",
        LARS,
        '/ (g_norm + weight_decay * w_norm + group["eps"])',
        '/ (g_norm + group["eps"])',
        ("tests/test_lamb_lars.py", "-k", "lars"),
    ),
    Mutant(
        "adam-default-lr-too-low-to-learn",
        "each optimizer with sensible defaults",
        "copier.yml",
        "'adam': 0.016,",
        "'adam': 0.000002,",
        ("tests/test_convergence.py", "-k", "adam and not adamw"),
    ),
    Mutant(
        "no-word-on-dataparallel",
        "DP vs DDP: DataParallel is not offered, and the README says why",
        "template/README.md.jinja",
        "between GPUs, all-reduced in buckets while the backward pass is still running.",
        "between GPUs.",
        ("tests/test_ddp.py", "-k", "dataparallel"),
    ),
    # Metrics
    Mutant(
        "throughput-not-measured",
        "throughput (samples/s) in the logs",
        TRAIN,
        "samples_per_s=speed)",
        "samples_per_s=0.0)",
        ("tests/test_matrix.py", "-k", "off-sgd"),
    ),
    Mutant(
        "metrics-history-not-checkpointed",
        "metrics.csv keeps every epoch across resumes: the checkpoints hold its rows",
        TRAIN,
        "        progress.history.append(row)",
        "        run.logger.history = [*run.logger.history, row]",
        ("tests/test_metrics_history.py", "-k", "damaged"),
    ),
    Mutant(
        "metrics-row-before-the-save",
        "a run stopped at a save (non-finite steps) adds no row to metrics.csv",
        TRAIN,
        "        progress.history.append(row)\n",
        "        progress.history.append(row)\n        run.logger.log(row)\n",
        ("tests/test_robustness.py", "-k", "non_finite_losses_stop"),
    ),
    Mutant(
        "metrics-behind-the-checkpoint-kept-aside",
        "a metrics.csv behind its checkpoint (a kill before it was written) is the run's own",
        LOGGER,
        "(ours.startswith(written) or past)",
        "past",
        ("tests/test_metrics_history.py", "-k", "damaged"),
    ),
    Mutant(
        "metrics-csv-written-in-place",
        "metrics.csv is replaced whole: a kill while it is written leaves the old one",
        LOGGER,
        "write_atomically(self.path, lambda f: f.write(self.csv()))",
        "self.path.write_bytes(self.csv())",
        ("tests/test_metrics_history.py", "-k", "replaced_whole"),
    ),
    Mutant(
        "metrics-of-older-checkpoints-dropped",
        "metrics.csv keeps its rows when resumed from a checkpoint without history",
        LOGGER,
        "            history += read_rows(self.path, epoch)",
        "            pass",
        ("tests/test_metrics_history.py", "-k", "older"),
    ),
    Mutant(
        "run-files-not-flushed",
        "atomic writes reach the disk before the rename",
        UTILS,
        "            os.fsync(f.fileno())\n",
        "",
        ("tests/test_metrics_history.py", "-k", "replaced_whole"),
    ),
    # Models and seeding
    Mutant(
        "bias-before-batchnorm",
        "no bias before BatchNorm",
        f"{PKG}/models.py.jinja",
        "self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)",
        "self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=True)",
        ("tests/test_rendered_suite.py",),
    ),
    Mutant(
        "cudnn-benchmark-off",
        "cudnn.benchmark on, off when determinism is asked for",
        UTILS,
        "torch.backends.cudnn.benchmark = not deterministic",
        "torch.backends.cudnn.benchmark = False",
        ("tests/test_loading.py", "-k", "deterministic"),
    ),
    # EMA
    Mutant(
        "ema-decay-swapped",
        "EMA of the weights: decay on the average, 1 - decay on the weights",
        PKG + "/{% if ema %}ema.py{% endif %}",
        "torch._foreach_lerp_(averaged, current, 1 - decay)",
        "torch._foreach_lerp_(averaged, current, decay)",
        ("tests/test_ema.py",),
    ),
    Mutant(
        "ema-never-updated",
        "EMA of the weights: updated after every optimizer step",
        TRAIN,
        "    parts.ema.update(parts.raw_model)",
        "    pass",
        ("tests/test_resume.py", "-k", "average_missing"),
    ),
    # DDP
    Mutant(
        "ddp-sampler-ignores-epoch",
        "DDP: DistributedSampler with set_epoch",
        DATA,
        "        gen = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)",
        "        gen = torch.Generator().manual_seed(self.seed * 100_003)",
        ("tests/test_device_data.py", "-k", "ddp"),
    ),
    Mutant(
        "loop-never-sets-the-epoch",
        "a new shuffle each epoch (set_epoch from the loop)",
        TRAIN,
        "run.set_epoch(epoch, start=progress.batch * args.batch_size)",
        "run.set_epoch(0, start=progress.batch * args.batch_size)",
        ("tests/test_device_data.py", "-k", "new_order"),
    ),
    Mutant(
        "ddp-all-reduce-every-micro-batch",
        "DDP: no_sync on accumulation micro-batches",
        TRAIN,
        "with nullcontext() if i == window - 1 else no_sync():",
        "with nullcontext():",
        ("tests/test_ddp.py", "-k", "all_reduced"),
    ),
    Mutant(
        "fsdp-gradient-sync-off-on-the-last-micro-batch",
        "FSDP: gradients reduced once per window, at its last micro-batch",
        TRAIN,
        "parts.model.set_requires_gradient_sync(i == window - 1)",
        "parts.model.set_requires_gradient_sync(i == 0)",
        ("tests/test_fsdp.py", "-k", "half_the_state"),
    ),
    Mutant(
        "fsdp-meta-init-each-rank-its-own-random-numbers",
        "FSDP: every process makes its shards of the same initial weights (--seed's)",
        SHARDING,
        "        torch.default_generator.manual_seed(seed)\n",
        "",
        ("tests/test_fsdp.py", "-k", "half_the_state"),
    ),
    Mutant(
        "fsdp-meta-init-out-of-build-order",
        "FSDP: a model built on meta gets the weights that building it whole gives",
        SHARDING,
        "        for module in children_first(model):",
        "        for module in reversed(list(model.modules())):",
        ("tests/test_fsdp.py", "-k", "built_whole"),
    ),
    Mutant(
        "fsdp-meta-init-without-the-builders-own",
        "FSDP: a model built on meta gets what its builder sets after its layers (ResNetSmall's)",
        SHARDING,
        "                set_whole(module, partial(init_weights, module), gathered=True)\n",
        "                pass\n",
        ("tests/test_fsdp.py", "-k", "built_whole"),
    ),
    Mutant(
        "fsdp-meta-init-unset-weight-unnoticed",
        "FSDP: a weight of a user's model that nothing initialises stops the run, named",
        SHARDING,
        "    if unset := sorted(set().union(*all_gather(unset))):",
        "    if unset := []:",
        ("tests/test_fsdp.py", "-k", "built_whole"),
    ),
    Mutant(
        "fsdp-every-rank-writes",
        "FSDP: rank 0 alone writes last.pt, best.pt and metrics.csv",
        CHECKPOINT,
        "parts.optimizer)\n{%- endif %}\n    if rank() > 0:\n        return\n",
        "parts.optimizer)\n{%- endif %}\n",
        ("tests/test_fsdp.py", "-k", "half_the_state"),
    ),
    Mutant(
        "fsdp-save-overwrites-the-shards-in-use",
        "FSDP: a save writes a new folder; a kill mid-save leaves the one last.pt names whole",
        CHECKPOINT,
        'name = f"{path.stem}.{max(numbers, default=-1) + 1}"',
        'name = f"{path.stem}.{max(numbers, default=0)}"',
        ("tests/test_fsdp.py", "-k", "cut_short"),
    ),
    Mutant(
        "fsdp-resume-without-the-optimizer-shards",
        "FSDP: a resume on another number of processes loads the optimizer's state too",
        CHECKPOINT,
        "        dcp.load(state, checkpoint_id=folder)\n",
        '        dcp.load({"model": weights}, checkpoint_id=folder)\n',
        ("tests/test_fsdp.py", "-k", "three_processes"),
    ),
    Mutant(
        "fsdp-lamb-trust-ratio-of-a-shard",
        "FSDP: LAMB's trust ratio takes the norms of each whole weight, not of a shard",
        LAMB,
        "                    w_norm = torch.linalg.vector_norm(p)\n"
        "                    u_norm = torch.linalg.vector_norm(update)\n",
        "                    w = getattr(p, 'to_local', lambda: p)()  # this process's shard\n"
        "                    u = getattr(update, 'to_local', lambda: update)()\n"
        "                    w_norm = torch.linalg.vector_norm(w)\n"
        "                    u_norm = torch.linalg.vector_norm(u)\n",
        ("tests/test_fsdp.py", "-k", "half_the_state"),
    ),
    Mutant(
        "fsdp-evaluation-out-of-step",
        "FSDP: a process with a validation batch fewer still joins every forward's gathers",
        TRAIN,
        "    for _ in range(most - len(batches)):  # in step with the processes that hold more\n"
        "        model(inputs)\n",
        "",
        ("tests/test_fsdp.py", "-k", "three_processes"),
    ),
    Mutant(
        "ddp-evaluation-pads",
        "DDP: evaluation counts every sample exactly once",
        DATA,
        "self.indices = range(rank(), length, process_count())",
        "self.indices = [i % length for i in range(rank(), length + 1, process_count())]",
        ("tests/test_ddp.py", "-k", "evaluation_counts"),
    ),
    Mutant(
        "ddp-every-rank-writes",
        "DDP: rank 0 alone writes checkpoints and logs",
        CHECKPOINT,
        "    if rank() > 0:\n        return\n    own = processes[0]",
        "    own = processes[0]",
        ("tests/test_ddp.py", "-k", "rank_zero_alone"),
    ),
    Mutant(
        "ddp-bad-loss-skipped-on-one-rank-only",
        "non-finite guard under DDP: a step bad on any process is skipped by all",
        GUARD,
        "        all_reduce_max(self.bad)\n",
        "",
        ("tests/test_ddp.py", "-k", "non_finite_on_one_rank"),
    ),
    # Checkpoints, resume and preemption
    Mutant(
        "resume-without-random-state",
        "exact resume: the random state",
        CHECKPOINT,
        '    set_rng_state(checkpoint["rng"])\n',
        "",
        ("tests/test_resume.py", "-k", "dropout"),
    ),
    Mutant(
        "resume-restarts-the-epoch",
        "exact resume: the position in the epoch",
        TRAIN,
        "run.set_epoch(epoch, start=progress.batch * args.batch_size)",
        "run.set_epoch(epoch, start=0)",
        ("tests/test_resume.py", "-k", "preemption"),
    ),
    Mutant(
        "checkpoint-written-in-place",
        "atomic checkpoint writes",
        UTILS,
        'tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")',
        "tmp = path",
        ("tests/test_robustness.py", "-k", "kill_9_during"),
    ),
    Mutant(
        "checkpoint-unpickled",
        "checkpoints loaded with weights_only",
        CHECKPOINT,
        'torch.load(path, map_location="cpu", weights_only=True)',
        'torch.load(path, map_location="cpu", weights_only=False)',
        ("tests/test_robustness.py", "-k", "bad_checkpoints"),
    ),
    Mutant(
        "sigusr1-ignored",
        "preemption: SIGTERM and SIGUSR1 checkpoint and exit",
        PREEMPTION,
        "NOTICES = (signal.SIGTERM, signal.SIGUSR1)",
        "NOTICES = (signal.SIGTERM,)",
        ("tests/test_resume.py", "-k", "preemption"),
    ),
    Mutant(
        "preemption-exits-0",
        "preemption: exit 75 so that the scheduler requeues",
        PREEMPTION,
        "REQUEUE_EXIT = 75",
        "REQUEUE_EXIT = 0",
        ("tests/test_resume.py", "-k", "preemption"),
    ),
    Mutant(
        "second-ctrl-c-waits",
        "Ctrl-C: finish the step and save; a second one stops at once",
        PREEMPTION,
        "            signal.signal(signum, self._previous[signum])\n",
        "",
        ("tests/test_resume.py", "-k", "ctrl_c"),
    ),
    Mutant(
        "two-runs-share-an-out-dir",
        "one run at a time in an --out-dir",
        UTILS,
        "        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n",
        "",
        ("tests/test_robustness.py", "-k", "same_out_dir"),
    ),
    Mutant(
        "eval-only-takes-the-runs-own-weights",
        "--eval-only evaluates exactly the weights named",
        TRAIN,
        "named = args.fresh or (args.eval_only and args.init_weights)",
        "named = args.fresh",
        ("tests/test_robustness.py", "-k", "eval_only_evaluates"),
    ),
    Mutant(
        "eval-only-fresh-scores-an-untrained-model",
        "--eval-only --fresh has nothing to evaluate",
        TRAIN,
        "    if args.eval_only and args.fresh and not (args.resume or args.init_weights):",
        "    if False:",
        ("tests/test_robustness.py", "-k", "bad_flag and fresh"),
    ),
    Mutant(
        "resume-and-init-weights-both-given",
        "--resume and --init-weights name two starting points: refused",
        TRAIN,
        "    if args.resume and args.init_weights:",
        "    if False:",
        ("tests/test_robustness.py", "-k", "bad_flag and init"),
    ),
    Mutant(
        "eval-only-scores-an-untrained-model",
        "--eval-only needs a checkpoint",
        TRAIN,
        "if args.eval_only and not (args.resume or args.init_weights or last.is_file()):",
        "if False:",
        ("tests/test_robustness.py", "-k", "bad_flag"),
    ),
    # The non-finite guard
    Mutant(
        "checkpoint-of-overflowed-weights",
        "no checkpoint is ever written with non-finite weights",
        CHECKPOINT,
        "    if not all_finite(parts.raw_model):",
        "    if False:",
        ("tests/test_robustness.py", "-k", "overflow"),
    ),
    Mutant(
        "fused-step-not-skipped",
        "non-finite losses never reach the weights (fused kernels)",
        GUARD,
        "self.optimizer.found_inf = self.bad  # the fused kernel skips the step when 1",
        "pass",
        ("tests/test_robustness.py", "-k", "non_finite"),
    ),
    Mutant(
        "max-bad-steps-ignored",
        "--max-bad-steps in a row stop the run",
        GUARD,
        "if max_bad_steps and in_row >= max_bad_steps:",
        "if False:",
        ("tests/test_robustness.py", "-k", "stop_the_run"),
    ),
    # Questions, update and migrations
    Mutant(
        "lr-zero-accepted",
        "validators: lr > 0",
        "copier.yml",
        "{% if not (lr > 0 and lr <= 100) %}",
        "{% if not (lr >= 0 and lr <= 100) %}",
        ("tests/test_questions.py",),
    ),
    Mutant(
        "package-named-after-an-output-folder",
        "validators: no package that git ignores",
        "copier.yml",
        "{% elif package_name in project_folders.split() %}",
        "{% elif package_name in [] %}",
        ("tests/test_gitignore.py",),
    ),
    Mutant(
        "wide-names-counted-by-length",
        "validators: a project name's width counts wide characters (CJK, emoji) as 2 columns",
        "copier.yml",
        "'..') | length %}{% if not project_name.strip() %}",
        "'.') | length %}{% if not project_name.strip() %}",
        ("tests/test_questions.py", "-k", "wide"),
    ),
    Mutant(
        "description-wrapped-by-length",
        "the description's lines fit ruff's width, wide characters and long words included",
        TRAIN,
        "| wordwrap(88, True, '\\n', False) |",
        "| wordwrap(88, False, '\\n', False) |",
        ("tests/test_questions.py", "-k", "text_answers"),
    ),
    Mutant(
        "update-drops-answers-fsdp-does-not-take",
        "an update to FSDP refuses the earlier answers FSDP does not take, not drops them",
        "copier.yml",
        "'fsdp'] %}distributed must be one of: single, ddp, fsdp{% elif fixes %}",
        "'fsdp'] %}distributed must be one of: single, ddp, fsdp{% elif false %}",
        ("tests/test_update.py", "-k", "contradict"),
    ),
    Mutant(
        "update-drops-device-data-for-tensors",
        "an update to data tensors refuses the device_data extra, not drops the extras",
        "copier.yml",
        "== 'tensors' and 'extras' not in _copier_conf.data",
        "== 'tensors' and false and 'extras' not in _copier_conf.data",
        ("tests/test_update.py", "-k", "contradict"),
    ),
    Mutant(
        "kept-script-loses-its-executable-bit",
        "update: a file kept for the user's edits keeps its mode",
        "hooks/migrate.py",
        "Path(target).chmod(Path(target).stat().st_mode | 0o111)",
        "pass",
        ("tests/test_update.py", "-k", "executable"),
    ),
    Mutant(
        "conflict-check-misses-markers",
        "update: conflict markers are found by the project's check",
        "template/tests/test_no_conflicts.py",
        "any(line.startswith(MARKERS) or line == SEPARATOR for line in lines)",
        "any(line == SEPARATOR for line in lines)",
        ("tests/test_gitignore.py", "-k", "conflict_check"),
    ),
    Mutant(
        "update-conflicts-pass-silently",
        "update: copier update fails naming the files it left conflicted",
        "hooks/check_conflicts.py",
        "    return 1\n",
        "    return 0\n",
        ("tests/test_update.py", "-k", "conflicting"),
    ),
    Mutant(
        "project-tests-hide-conflicts",
        "update: the project's tests name conflicted files even when collection breaks",
        "template/tests/conftest.py",
        "    if problems:\n",
        "    if False:\n",
        ("tests/test_update.py", "-k", "conflicting"),
    ),
    Mutant(
        "extras-migration-drops-the-ema",
        "migrations: ema and logger answers become extras",
        "hooks/migrate.py",
        '    if ema and ema.group(1).lower() == "true":',
        "    if False:",
        ("tests/test_migrations.py", "-k", "extras"),
    ),
    Mutant(
        "update-deletes-edited-files",
        "update: a file the update removes keeps the user's edits (a renamed package, an "
        "extra turned off)",
        "hooks/migrate.py",
        "if release.is_file() and release.read_bytes() == yours:",
        "if release.is_file():",
        ("tests/test_update.py", "-k", "renamed or drops"),
    ),
    Mutant(
        "rename-keeps-imports-of-the-old-package",
        "update: a renamed package's imports follow it",
        "hooks/migrate.py",
        'if path.suffix == ".py" and rewrite_imports(text, old, new) != text:',
        "if False:",
        ("tests/test_update.py", "-k", "renamed_package_takes"),
    ),
    Mutant(
        "interrupted-update-left-half-done",
        "update: an interrupted update puts the project back at its last commit",
        "hooks/guard_update.py",
        'if not is_running(note["copier"]):\n            break',
        'if not is_running(note["copier"]):\n            return 0',
        ("tests/test_update.py", "-k", "interrupted"),
    ),
    Mutant(
        "old-checkpoints-misread",
        "upgrade matrix: a checkpoint of an earlier release resumes or is refused in one line "
        "(a new format without the upgrade of the last one)",
        CHECKPOINT,
        "FORMAT = 2",
        "FORMAT = 3",
        ("tests/test_upgrades.py",),
    ),
    Mutant(
        "finders-rendered-when-left-out",
        "an extra left out leaves no trace",
        TRAIN,
        "{%- if finders %}\n    python train.py --find-lr",
        "{%- if true %}\n    python train.py --find-lr",
        ("tests/test_matrix.py", "-k", "off-sgd-warmup_cosine"),
    ),
    Mutant(
        "format-1-checkpoints-resumed",
        "a checkpoint of v0.6.0 or earlier is refused in one line, not misread",
        CHECKPOINT,
        'if checkpoint.get("format", 1) < FORMAT:',
        'if checkpoint.get("format", 1) < 1:',
        ("tests/test_resume.py", "-k", "part_way_epoch_resumes_only"),
    ),
    Mutant(
        "infinite-flags-accepted",
        "numbers that are not finite are refused",
        UTILS,
        "if not abs(value) <= torch.finfo(torch.float32).max:",
        "if False:",
        ("tests/test_robustness.py", "-k", "bad_flag"),
    ),
    Mutant(
        "elapsed-restarts-on-resume",
        "elapsed_s carries on across resumes",
        TRAIN,
        "    started = time.perf_counter() - progress.elapsed_s",
        "    started = time.perf_counter()",
        ("tests/test_resume.py", "-k", "preemption_signal and SIGTERM and process"),
    ),
    # Your own data, model and loss
    Mutant(
        "labels-past-the-classes-pass",
        "targets the default loss cannot take are one line, before training",
        DATA,
        "    elif targets.min() >= 0 and targets.max() < classes:",
        "    elif targets.min() >= 0:",
        ("tests/test_data_mistakes.py", "-k", "label"),
    ),
    Mutant(
        "validation-set-unchecked",
        "the validation set's mistakes are one line before training, not after an epoch",
        DATA,
        "    check_info(train_set, info, args.data, val_set)",
        "    check_info(train_set, info, args.data)",
        ("tests/test_data_mistakes.py", "-k", "validation"),
    ),
    Mutant(
        "empty-sets-pass",
        "an empty training or validation set is one line, before training",
        DATA,
        "        if part is not None and len(part) == 0:",
        "        if False:",
        ("tests/test_data_mistakes.py", "-k", "empty"),
    ),
    Mutant(
        "nan-inputs-pass",
        "inputs that are not finite are one line, before training",
        DATA,
        "    if inputs.is_floating_point() and not inputs.isfinite().all():",
        "    if False:",
        ("tests/test_data_mistakes.py", "-k", "NaN"),
    ),
    Mutant(
        "batches-unchecked",
        "the loader checks each batch as it makes it: mistakes outside the sample are one line",
        DATA,
        ', "collate_fn": checked}',
        "}",
        ("tests/test_data_mistakes.py", "-k", "outside"),
    ),
    Mutant(
        "worker-errors-keep-their-traceback",
        "an error raised in a loader worker is one line",
        UTILS,
        'if message.startswith("Caught ") and',
        'if False and message.startswith("Caught ") and',
        ("tests/test_robustness.py", "-k", "unreadable_image"),
    ),
    Mutant(
        "data-check-draws-from-the-run-seed",
        "checking the data leaves the run's random state as it was",
        DATA,
        "with torch.random.fork_rng(devices=[]):  # augmentation",
        "if True:",
        ("tests/test_data_mistakes.py", "-k", "random_state"),
    ),
    Mutant(
        "folder-walk-loops",
        "image folders: no folder is walked twice",
        DATA,
        "    if (found.st_dev, found.st_ino) in entered:",
        "    if False:",
        ("tests/test_data_mistakes.py", "-k", "walks_each_folder"),
    ),
    Mutant(
        "hidden-folders-are-classes",
        "image folders: hidden folders (.ipynb_checkpoints) are no classes",
        DATA,
        'if e.is_dir() and e.name[0] != ".")',
        "if e.is_dir())",
        ("tests/test_data_mistakes.py", "-k", "hidden"),
    ),
    Mutant(
        "image-errors-unnamed",
        "image folders: an image that cannot be read is one line naming it",
        DATA,
        "ImageFiles(folder, transform=tf, loader=load_image)",
        "ImageFiles(folder, transform=tf)",
        ("tests/test_data_mistakes.py", "-k", "cannot_be_read"),
    ),
    Mutant(
        "large-images-read",
        "image folders: an image past PIL's limit against decompression bombs is one line",
        DATA,
        '            warnings.simplefilter("error", Image.DecompressionBombWarning)\n',
        "",
        ("tests/test_data_mistakes.py", "-k", "past"),
    ),
    Mutant(
        "nan-stop-blames-the-lr",
        "a non-finite loss from the first step on points at the data, not --lr",
        GUARD,
        "            if in_row == self.steps and not self.resumed:",
        "            if False:",
        ("tests/test_data_mistakes.py", "-k", "blaming"),
    ),
    Mutant(
        "nan-stop-claims-a-checkpoint",
        "a run stopped by non-finite losses says a checkpoint stays only when there is one",
        GUARD,
        '            if not (Path(out_dir) / "last.pt").is_file():',
        "            if False:",
        ("tests/test_data_mistakes.py", "-k", "blaming"),
    ),
    Mutant(
        "overflow-claims-a-checkpoint",
        "a run stopped by weights that overflowed says a checkpoint stays only when there is one",
        CHECKPOINT,
        '        if not (path.parent / "last.pt").is_file():',
        "        if False:",
        ("tests/test_data_mistakes.py", "-k", "blaming"),
    ),
    Mutant(
        "float-inputs-rescaled",
        "float inputs reach the model untouched unless the data set declares a normalisation",
        DATA,
        "        elif inputs.dtype != self.dtype:\n            inputs = inputs.to(self.dtype)",
        "        else:\n            inputs = inputs.float() / 255",
        ("tests/test_rendered_suite.py", "-k", "defaults"),
    ),
    Mutant(
        "data-info-unchecked",
        "a DataInfo that cannot fit the data is refused in one line",
        DATA,
        "    elif info.mean is not None and not len(info.mean) == len(info.std) == shape[0]:",
        "    elif False:",
        ("tests/test_rendered_suite.py", "-k", "defaults"),
    ),
    Mutant(
        "batch-finder-one-step-epochs",
        "batch-size finder: at least 16 optimizer steps per epoch",
        FINDERS,
        "    cap = min(args.max_batch_size, steps_cap)",
        "    cap = args.max_batch_size",
        ("tests/test_rendered_suite.py", "-k", "finders"),
    ),
    Mutant(
        "timed-save-never-due",
        "preemption: --save-every-minutes checkpoints on a timer",
        PREEMPTION,
        "        due = 0 < self.minutes <= (time.monotonic() - self.last_save) / 60",
        "        due = False",
        ("tests/test_ddp.py", "-k", "save_every_minutes"),
    ),
    Mutant(
        "guard-counts-across-epochs",
        "non-finite steps counted per epoch",
        GUARD,
        "        self.bad_steps.zero_()\n",
        "",
        ("tests/test_ddp.py", "-k", "non_finite_on_one_rank"),
    ),
    Mutant(
        "more-epochs-stretch-the-schedule",
        "resuming with more --epochs: the schedule goes on, or restarts, but never stretches",
        TRAIN,
        "build_scheduler(optimizer, args, progress.schedule_epochs, steps_per_epoch)",
        "build_scheduler(optimizer, args, args.epochs, steps_per_epoch)",
        ("tests/test_schedules.py", "-k", "more_epochs"),
    ),
    Mutant(
        "ddp-ema-keeps-each-process-batchnorm",
        "DDP: evaluation with rank 0's BatchNorm statistics, as checkpoints hold them",
        TRAIN,
        "    broadcast_buffers(model)\n",
        "",
        ("tests/test_resume.py", "-k", "ddp_preempted"),
    ),
    Mutant(
        "tensor-projects-import-torchvision",
        "data: tensors leaves the image machinery out",
        DATA,
        "{%- if images %}\nfrom torchvision import transforms\nfrom torchvision.datasets import"
        " ImageFolder\nfrom torchvision.datasets.folder import IMG_EXTENSIONS\n{%- endif %}",
        "\nfrom torchvision import transforms",
        ("tests/test_matrix.py", "-k", "off-sgd-cyclic or off-sgd-step"),
    ),
    Mutant(
        "save-every-ignored",
        "--save-every checkpoints part-way through an epoch",
        TRAIN,
        "        if action or (args.save_every and progress.step % args.save_every == 0):",
        "        if action:",
        ("tests/test_resume.py", "-k", "torchrun_restarts"),
    ),
    Mutant(
        "synthetic-saturates",
        "the built-in synthetic images do not saturate",
        DATA,
        "mix = 0.55 * torch.rand(length, 1, 1, 1, generator=gen)",
        "mix = 0.0 * torch.rand(length, 1, 1, 1, generator=gen)",
        ("tests/test_rendered_suite.py", "-k", "defaults"),
    ),
    Mutant(
        "validation-set-smaller-than-the-processes",
        "torchrun: a validation set with fewer items than processes is refused in one line",
        DATA,
        "    if len(val_set) < process_count():  # a process with none could not evaluate in step",
        "    if False:",
        ("tests/test_ddp.py", "-k", "smaller_than_the_processes"),
    ),
    Mutant(
        "project-name-padded-accepted",
        "questions: a project_name beginning or ending with spaces is refused",
        "copier.yml",
        "{% elif project_name != project_name.strip()",
        "{% elif false",
        ("tests/test_questions.py", "-k", "padded"),
    ),
    Mutant(
        "peer-gone-traceback",
        "torchrun: a process whose peer stopped says so in one line, not gloo's traceback",
        TRAIN,
        '        if "by peer" not in str(error):',
        "        if True:",
        ("tests/test_ddp.py", "-k", "stops_in_training"),
    ),
    Mutant(
        "replaced-shards-called-torn",
        "FSDP: a folder of shards that a newer save replaced is said to be so, not torn",
        CHECKPOINT,
        "        if not folder.exists() and max(numbers, default=-1) > int(folder.suffix[1:]):",
        "        if False:",
        ("tests/test_fsdp.py", "-k", "cut_short"),
    ),
    Mutant(
        "fresh-run-mixes-tensorboard-curves",
        "TensorBoard: a fresh run moves an earlier run's events to tensorboard.bak",
        LOGGER,
        "        if another and events.is_dir():  # the curves of the run that wrote metrics.csv",
        "        if False:",
        ("tests/test_robustness.py", "-k", "tensorboard_curves"),
    ),
    Mutant(
        "resume-short-of-the-schedule-silent",
        "a resume whose --epochs stops before the schedule's end says so",
        CHECKPOINT,
        "    if progress.epoch < args.epochs < sum(span) and not args.eval_only:",
        "    if False:",
        ("tests/test_schedules.py", "-k", "stops_before_the_schedules_end"),
    ),
    Mutant(
        "short-onecycle-padded",
        "1cycle: a short run rises over two steps and ends at its final rate, not padded",
        SCHEDULE,
        "    pct_start = max(args.pct_start, 2 / total) if total > 2 else args.pct_start",
        "    pct_start = args.pct_start",
        ("tests/test_schedules.py", "-k", "short_onecycle"),
    ),
    Mutant(
        "short-run-line-when-no-batch-fits",
        "the batch of a short run: data too small for any batch is left to train.py's check",
        DATA,
        "    if steps(batch) == 0:  # no batch this small fits the data: train.py's check says "
        "what does",
        "    if False:",
        ("tests/test_schedules.py", "-k", "halves_the_default_batch"),
    ),
    Mutant(
        "resume-misses-tensorboard-rows",
        "TensorBoard: a resumed run writes its checkpoint's rows again (none missed)",
        LOGGER,
        "        for row in history:\n"
        '            self.add_scalars(row, started + row["elapsed_s"])\n',
        "",
        ("tests/test_robustness.py", "-k", "tensorboard_curves"),
    ),
    Mutant(
        "resume-duplicates-tensorboard-rows",
        "TensorBoard: the rows a resumed run writes again replace the earlier events",
        LOGGER,
        "purge_step=1 if history else None",
        "purge_step=None",
        ("tests/test_robustness.py", "-k", "tensorboard_curves"),
    ),
    Mutant(
        "short-run-advises-a-batch-too-large",
        "the batch of a short run: --batch-size N is suggested only where the data holds one",
        DATA,
        'keeps {BATCH_SIZE}" if at_answer else ""',
        'keeps {BATCH_SIZE}" if True else ""',
        ("tests/test_schedules.py", "-k", "halves_the_default_batch"),
    ),
    Mutant(
        "fsdp-readme-loads-a-pointer",
        "FSDP: the README's Outputs code loads the weights that python -m sharding writes",
        "template/README.md.jinja",
        "\"{{ 'best-weights.pt' if fsdp else 'runs/default/best.pt' }}\"",
        '"runs/default/best.pt"',
        ("tests/test_fsdp.py", "-k", "loads_anywhere"),
    ),
    Mutant(
        "readme-installs-too-little",
        "the README's pip install names every dependency of pyproject.toml",
        "template/README.md.jinja",
        "{% else %} numpy{% endif %} tqdm",
        "{% endif %} tqdm",
        ("tests/test_questions.py", "-k", "installs_what"),
        occurrences=2,
    ),
    Mutant(
        "sharding-export-warns",
        "python -m sharding writes the weights without torch's warning about one process",
        SHARDING,
        '        warnings.filterwarnings("ignore", "torch.distributed is disabled")\n',
        "",
        ("tests/test_fsdp.py", "-k", "loads_anywhere"),
    ),
    Mutant(
        "resume-resets-tensorboard-times",
        "TensorBoard: rows written again on resume keep their spacing in time (elapsed_s)",
        LOGGER,
        'self.add_scalars(row, started + row["elapsed_s"])',
        "self.add_scalars(row)",
        ("tests/test_robustness.py", "-k", "tensorboard_curves"),
    ),
    Mutant(
        "older-checkpoint-hides-tensorboard-curves",
        "TensorBoard: a resume whose metrics.csv goes aside moves the events aside with it",
        LOGGER,
        "if another and events.is_dir():",
        "if another and not history and events.is_dir():",
        ("tests/test_robustness.py", "-k", "tensorboard_curves"),
    ),
    Mutant(
        "cyclic-part-way-says-any-end-will-do",
        "a part-way checkpoint's refusal under cyclic or 1cycle says no epoch's end takes any",
        CHECKPOINT,
        "f\"{accum}{% if scheduler not in ['onecycle', 'cyclic'] %} (a checkpoint from the end of "
        'an epoch takes any){% endif %}"',
        'f"{accum} (a checkpoint from the end of an epoch takes any)"',
        ("tests/test_schedules.py", "-k", "cyclic_resumed"),
    ),
    Mutant(
        "lars-unclipped-by-default",
        "LARS clips by default: its biases and norms take --lr as SGD does",
        TRAIN,
        "default={{ 0.0 if optimizer == 'lamb' else 1.0 }}",
        "default={{ 0.0 if optimizer in ['lamb', 'lars'] else 1.0 }}",
        ("tests/test_rendered_suite.py", "-k", "own_data and lars"),
    ),
    Mutant(
        "no-clipping-by-default",
        "gradients clipped at norm 1 by default, against collapse",
        TRAIN,
        "default={{ 0.0 if optimizer == 'lamb' else 1.0 }}",
        "default=0.0",
        ("tests/test_training_step.py", "-k", "by_default"),
    ),
    Mutant(
        "imports-split-without-trailing-comma",
        "imports written as ruff format writes them: one name a line, each with its comma",
        TRAIN,
        "    {{ name }},\n",
        "    {{ name }}\n",
        ("tests/test_matrix.py", "-k", "off-sgd-warmup_cosine"),
    ),
    Mutant(
        "collapse-unnoticed",
        "a run fallen back to chance says so on its epoch line",
        LOGGER,
        '    if gain < 20 or row["val_acc"] - chance > gain / 5:',
        "    if True:",
        ("tests/test_training_step.py", "-k", "chance"),
    ),
    Mutant(
        "loader-workers-die-on-sigterm",
        "preemption: a signal to the whole process group leaves the loader workers running",
        DATA,
        '    options["worker_init_fn"] = ignore_signals\n',
        "",
        ("tests/test_resume.py", "-k", "preemption_signal and SIGTERM and group"),
    ),
    Mutant(
        "launch-sh-exits-0-when-preempted",
        "preemption: scripts/launch.sh exits with 75 for a requeue",
        LAUNCH,
        'if [ "$status" = 0 ] && [ -s "$REQUEUE_FILE" ]; then',
        "if false; then",
        ("tests/test_resume.py", "-k", "launch_sh and script"),
    ),
    Mutant(
        "torchrun-handles-preemption-signals",
        "preemption: torchrun does not end the training processes on a signal for them",
        LAUNCH,
        "args+=(--signals-to-handle=SIGHUP,SIGQUIT)\n",
        "",
        ("tests/test_resume.py", "-k", "launch_sh and every"),
    ),
    Mutant(
        "slurm-one-node-per-torchrun",
        "SLURM: one torchrun per task meets the others at the rendezvous",
        SLURM,
        "export NNODES=$SLURM_NTASKS",
        "export NNODES=$SLURM_NNODES",
        ("tests/test_slurm.py", "-k", "preempted"),
    ),
    Mutant(
        "slurm-preemption-kills-srun",
        "SLURM: a preempted job checkpoints before it is requeued",
        SLURM,
        'scancel --signal=TERM "$SLURM_JOB_ID"',
        'kill -TERM "$training"',
        ("tests/test_slurm.py", "-k", "preempted"),
    ),
    Mutant(
        "slurm-requeues-failures",
        "SLURM: a failing rank fails the job instead of requeueing it",
        SLURM,
        'if [ "$requeue" = 75 ]; then',
        'if [ "$status" != 0 ]; then',
        ("tests/test_slurm.py", "-k", "failing"),
    ),
    Mutant(
        "renamed-answer-lost",
        "migrations: a renamed question keeps its answer",
        "hooks/migrate.py",
        'ANSWERS.write_text(re.sub(rf"^{re.escape(old)}:", f"{new}:", text, flags=re.MULTILINE))',
        "pass",
        ("tests/test_migrations.py",),
    ),
    Mutant(
        "git-init-commits-nothing",
        "git_init: the project committed from day one",
        "hooks/git_init.py",
        'git("add", "--all")',
        'git("add", "--", ".copier-answers.yml")',
        ("tests/test_hooks.py",),
    ),
    Mutant(
        "git-init-never-asked",
        "git_init: asked in a terminal on copy (questions do not see _copier_operation)",
        "copier.yml",
        "(_copier_operation | default('copy')) == 'copy'",
        "_copier_operation == 'copy'",
        ("tests/test_hooks.py", "-k", "asked_in_a_terminal"),
    ),
    # Silent or contradictory flags and answers: refused in one line
    Mutant(
        "float32-zero-accepted",
        "flags: a number that a float32 holds as 0 (or past a bound) is refused",
        UTILS,
        "if kind is float and outside(single := torch.tensor(value, dtype=torch.float32)):",
        "if False:",
        ("tests/test_robustness.py", "-k", "contradictory and float32"),
    ),
    Mutant(
        "float32-check-against-double-bounds",
        "flags: a closed bound takes its end, also when a float32 cannot hold it exactly",
        UTILS,
        "outside(single := torch.tensor(value, dtype=torch.float32)):",
        "outside(single := torch.tensor(value, dtype=torch.float32).item()):",
        ("tests/test_robustness.py", "-k", "just_inside"),
    ),
    Mutant(
        "fresh-with-resume-accepted",
        "flags: --fresh with --resume is refused",
        UTILS,
        "    if args.resume and args.fresh:",
        "    if False:",
        ("tests/test_robustness.py", "-k", "contradictory and fresh"),
    ),
    Mutant(
        "out-dir-in-the-project-accepted",
        "flags: an --out-dir that is the project's folder is refused",
        UTILS,
        '    if (Path(args.out_dir) / "train.py").exists():',
        "    if False:",
        ("tests/test_robustness.py", "-k", "contradictory and out"),
    ),
    Mutant(
        "missing-cuda-device-accepted",
        "flags: a --device this machine lacks is refused as the flags are parsed",
        UTILS,
        "    if colon and int(index) >= (count := torch.cuda.device_count()):",
        "    if False:",
        ("tests/test_robustness.py", "-k", "devices_the"),
    ),
    Mutant(
        "find-lr-with-resume-accepted",
        "flags: --find-lr with --resume is refused",
        FINDERS,
        "    if args.find_lr and args.resume:",
        "    if False:",
        ("tests/test_robustness.py", "-k", "contradictory and find"),
    ),
    Mutant(
        "floor-above-the-peak-accepted",
        "schedules: a --min-lr above --lr is refused",
        SCHEDULE,
        '    if args.min_lr is not None and args.lr != "auto" and args.min_lr > args.lr:',
        "    if False:",
        ("tests/test_schedules.py", "-k", "contradictory and (floor or bottom)"),
    ),
    Mutant(
        "warmup-past-the-run-accepted",
        "schedules: a warmup longer than the schedule is refused",
        SCHEDULE,
        "    if args.warmup_steps is None and (args.warmup_epochs or 0) > epochs:",
        "    if False:",
        ("tests/test_schedules.py", "-k", "contradictory and warmup"),
    ),
    Mutant(
        "default-warmup-a-whole-epoch",
        "schedules: the default warmup is an epoch, at most half the schedule",
        SCHEDULE,
        "return min(1.0, epochs / 2) if args.warmup_epochs is None else args.warmup_epochs",
        "return 1.0 if args.warmup_epochs is None else args.warmup_epochs",
        ("tests/test_schedules.py", "-k", "default_warmup"),
    ),
    Mutant(
        "restarts-default-a-quarter",
        "cosine_restarts: by default the run after warmup is two cycles",
        SCHEDULE,
        "first_cycle = max(1, epochs * steps_per_epoch - warmup) / (1 + mult)",
        "first_cycle = round(epochs / 4 * steps_per_epoch)",
        ("tests/test_schedules.py", "-k", "restart_at_the_peak"),
    ),
    Mutant(
        "cyclic-default-two-epochs",
        "cyclic: by default the run is whole cycles, ending at the bottom",
        SCHEDULE,
        "length = max(1, epochs * steps_per_epoch - 1) / max(1, round(epochs / 2))",
        "length = 2 * steps_per_epoch",
        ("tests/test_schedules.py", "-k", "whole_cycle"),
    ),
    Mutant(
        "cyclic-resume-keeps-old-cycles",
        "cyclic: a resume with other steps per epoch is refused",
        CHECKPOINT,
        "    if theirs != ours and not (args.eval_only or restarted):",
        "    if False:",
        ("tests/test_schedules.py", "-k", "other_steps_per_epoch"),
    ),
    Mutant(
        "cycled-momentum-ignores-the-flag",
        "1cycle and cyclic cycle the momentum down from --momentum",
        SCHEDULE,
        "{%- set momentum = 'args.momentum' if optimizer in ['sgd', 'lars'] else 'args.beta1' -%}",
        "{%- set momentum = '0.95' -%}",
        ("tests/test_schedules.py", "-k", "tenth_below"),
    ),
    Mutant(
        "warmup-steps-past-the-schedule-accepted",
        "schedules: --warmup-steps past the schedule's steps are refused when it is built",
        SCHEDULE,
        "    if total and args.warmup_steps is not None and args.warmup_steps > total:",
        "    if False:",
        ("tests/test_schedules.py", "-k", "warmup_steps_past"),
    ),
    Mutant(
        "resume-ignores-changed-flags",
        "resume: flags whose values the checkpoint holds are refused when they differ",
        CHECKPOINT,
        "    if changed and not args.eval_only:",
        "    if False:",
        ("tests/test_robustness.py", "-k", "cannot_take"),
    ),
    Mutant(
        "new-schedule-refuses-new-flags",
        "resume: --more-epochs restart takes new optimizer and schedule flags",
        CHECKPOINT,
        'kept = ("seed",) if restarted else ("seed", *STATE_FLAGS)',
        'kept = ("seed", *STATE_FLAGS)',
        ("tests/test_robustness.py", "-k", "new_schedule_takes"),
    ),
    Mutant(
        "state-flags-miss-an-optimizer-flag",
        "resume: every optimizer flag is among those compared with the checkpoint's",
        CHECKPOINT,
        "'adadelta': ['rho']",
        "'adadelta': []",
        ("tests/test_matrix.py", "-k", "off-adadelta-warmup_cosine"),
    ),
    Mutant(
        "batch-finder-resume-unscaled-lr",
        "resume: --batch-size auto scales --lr as the run's start did, so the same command resumes",
        FINDERS,
        '        if checkpoint is not None and args.lr != "auto":  # scaled as when the run began',
        "        if False:",
        ("tests/test_finders.py", "-k", "scales_the_lr_as"),
    ),
    Mutant(
        "ddp-part-way-checkpoint-resumed-alone",
        "resume: a part-way checkpoint of DDP processes is refused by one process",
        CHECKPOINT,
        "    if progress.batch > 0 and processes > 1 and not args.eval_only:",
        "    if False:",
        ("tests/test_robustness.py", "-k", "ddp_processes"),
    ),
    Mutant(
        "synthetic-set-past-the-memory",
        "data: a synthetic set larger than the memory is refused before it is made",
        DATA,
        "    if 16 * values > memory:",
        "    if False:",
        ("tests/test_robustness.py", "-k", "too_large"),
    ),
    Mutant(
        "yes-no-answer-any-text",
        "questions: a yes/no answer that is not a boolean's spelling is refused",
        "copier.yml",
        "{% set given = _copier_conf.data.get('compile', true) | string | trim | lower %}",
        "{% set given = 'true' %}",
        ("tests/test_questions.py", "-k", "compile"),
    ),
    Mutant(
        "derived-answer-given",
        "questions: the answers derived from others cannot be given",
        "copier.yml",
        "{% if 'ddp' in _copier_conf.data %}",
        "{% if false %}",
        ("tests/test_questions.py", "-k", "given"),
    ),
    Mutant(
        "pip-not-reserved",
        "questions: package_name cannot shadow a tool run with python -m (pip)",
        "copier.yml",
        "    pip py pytest ruff",
        "    py pytest ruff",
        ("tests/test_questions.py", "-k", "pip or reserved_names"),
    ),
    Mutant(
        "float32-zero-lr-answer",
        "questions: an lr that a float32 holds as 0 is refused",
        "copier.yml",
        "lr < 1e-45 %}",
        "lr < 0 %}",
        ("tests/test_questions.py", "-k", "float32"),
    ),
    Mutant(
        "untested-torch-floor",
        "the lowest torch a project declares is the one make test-floor tests",
        "template/pyproject.toml.jinja",
        '"torch>=2.13",',
        '"torch>=2.4",',
        ("tests/test_floor.py", "-k", "declared"),
    ),
    # Issue 26: value tests (optimizers, best.pt, fp16 resume)
    Mutant(
        "sgd-without-nesterov",
        "optimizer: SGD with Nesterov momentum",
        OPTIM,
        "nesterov=args.momentum > 0)",
        "nesterov=False)",
        ("tests/test_optimizer_options.py", "-k", "sgd"),
    ),
    Mutant(
        "adam-betas-dropped",
        "optimizer: Adam's betas from --beta1 and --beta2",
        OPTIM,
        "    options = dict(lr=args.lr, betas=(args.beta1, args.beta2))\n"
        "    return {% if fused %}fused_or_foreach(torch.optim.Adam,",
        "    options = dict(lr=args.lr)\n"
        "    return {% if fused %}fused_or_foreach(torch.optim.Adam,",
        ("tests/test_optimizer_options.py", "-k", "adam"),
    ),
    Mutant(
        "nadam-coupled-weight-decay",
        "optimizer: NAdam's decoupled weight decay",
        OPTIM,
        "betas=(args.beta1, args.beta2), decoupled_weight_decay=True",
        "betas=(args.beta1, args.beta2)",
        ("tests/test_optimizer_options.py", "-k", "nadam"),
    ),
    Mutant(
        "best-keeps-the-highest-val-loss",
        "best.pt: the epoch of the best score, the validation accuracy",
        TRAIN,
        '    return row["val_acc"]\n',
        '    return row["val_loss"]\n',
        ("tests/test_checkpoint_values.py", "-k", "best_pt"),
    ),
    Mutant(
        "best-ignores-the-ema",
        "best.pt: with EMA, the epoch of the average's best accuracy",
        TRAIN,
        'return row.get("ema_val_acc", row["val_acc"])',
        'return row["val_acc"]',
        ("tests/test_checkpoint_values.py", "-k", "best_pt"),
    ),
    Mutant(
        "fp16-scaler-read-under-another-key",
        "AMP: a resumed fp16 run takes the GradScaler's state back",
        CHECKPOINT,
        '    if checkpoint.get("scaler"):\n'
        '        parts.scaler.load_state_dict(checkpoint["scaler"])',
        '    if checkpoint.get("grad_scaler"):\n'
        '        parts.scaler.load_state_dict(checkpoint["grad_scaler"])',
        ("tests/test_checkpoint_values.py", "-k", "fp16"),
    ),
    # Issue 26: value tests (validation purity, DDP metrics)
    Mutant(
        "validation-set-augmented",
        "data: the validation set is never augmented",
        DATA,
        "        train_set.transform = augment(size, hflip)",
        "        train_set.transform = val_set.transform = augment(size, hflip)",
        ("tests/test_augmentation.py", "-k", "synthetic"),
    ),
    Mutant(
        "train-loss-of-rank-0",
        "DDP: train_loss is the mean over every process's batches",
        METRICS,
        "        *sums, count = all_reduce_sum(self.fold().clone()).tolist()",
        "        *sums, count = self.fold().tolist()",
        ("tests/test_ddp.py", "-k", "train_loss_over_all"),
    ),
    # Issue 26: the sweep (value assertions for existence checks)
    Mutant(
        "batches-cross-as-float",
        "loader batches cross to the device as uint8, made float there",
        DATA,
        "        inputs = inputs.to(self.device, non_blocking=True)",
        "        inputs = inputs.float().to(self.device, non_blocking=True)",
        ("tests/test_loading.py", "-k", "cross"),
    ),
    Mutant(
        "batch-copies-block",
        "copies to the device are asynchronous (non_blocking, from pinned memory)",
        DATA,
        "        inputs = inputs.to(self.device, non_blocking=True)",
        "        inputs = inputs.to(self.device)",
        ("tests/test_loading.py", "-k", "cross"),
    ),
    Mutant(
        "memory-never-pinned",
        "pinned memory on CUDA",
        DATA,
        '"pin_memory": device.type == "cuda"',
        '"pin_memory": False',
        ("tests/test_loading.py", "-k", "pins"),
    ),
    Mutant(
        "tqdm-monitor-thread-at-fork",
        "no thread starts as the loaders fork their workers (a fork then can hang a worker)",
        TRAIN,
        "tqdm.monitor_interval = 0\n",
        "",
        ("tests/test_loading.py", "-k", "tqdm"),
    ),
    Mutant(
        "validation-batches-as-small-as-training",
        "validation batches twice the training batch (no gradients to hold)",
        DATA,
        "val_loader = DataLoader(val_set, args.batch_size * 2, ",
        "val_loader = DataLoader(val_set, args.batch_size, ",
        ("tests/test_loading.py", "-k", "pins"),
    ),
    Mutant(
        "cudnn-tf32-when-deterministic",
        "--deterministic turns TF32 off in cuDNN too",
        UTILS,
        "    torch.backends.cudnn.allow_tf32 = not deterministic\n",
        "",
        ("tests/test_loading.py", "-k", "deterministic"),
    ),
    Mutant(
        "loader-order-ignores-the-seed",
        "the training order is fixed by (--seed, epoch)",
        DATA,
        "\n    sampler = TrainSampler(len(train_set), args.seed)",  # the loader's
        "\n    sampler = TrainSampler(len(train_set), 0)",
        ("tests/test_device_data.py", "-k", "new_order"),
    ),
    Mutant(
        "device-data-order-ignores-the-seed",
        "the on-device training order is fixed by (--seed, epoch)",
        DATA,
        "DeviceData(*tensors, args.batch_size, args.seed, info.hflip, device)",
        "DeviceData(*tensors, args.batch_size, 0, info.hflip, device)",
        ("tests/test_device_data.py", "-k", "new_order"),
    ),
    Mutant(
        "device-data-held-as-float",
        "the on-device training set is kept as uint8",
        DEVICE_DATA,
        "self.images, self.labels = images.to(device), labels.to(device)",
        "self.images, self.labels = images.float().to(device), labels.to(device)",
        ("tests/test_device_data.py", "-k", "uint8"),
    ),
    Mutant(
        "device-data-takes-all-free-memory",
        "--data-on-device auto on CUDA: a quarter of the free memory at most",
        DEVICE_DATA,
        "return tensors[0].nbytes < free // 4",
        "return tensors[0].nbytes < free",
        ("tests/test_device_data.py", "-k", "uint8"),
    ),
    Mutant(
        "epoch-loss-of-the-last-fold",
        "train_loss: the mean over the whole epoch, added up at every log interval",
        METRICS,
        "            self.totals += torch.cat(",
        "            self.totals = torch.cat(",
        ("tests/test_training_step.py", "-k", "smoothing"),
    ),
    Mutant(
        "accuracy-as-a-fraction",
        "val_acc in percent",
        TRAIN,
        '"acc": 100 * (outputs.argmax(1) == targets).sum(),',
        '"acc": (outputs.argmax(1) == targets).sum(),',
        ("tests/test_training_step.py", "-k", "smoothing"),
    ),
    Mutant(
        "logged-lr-is-the-peak",
        "metrics.csv: the learning rate the schedule reached",
        TRAIN,
        "row.update(lr=progress.lr, samples_per_s=speed)",
        "row.update(lr=args.lr, samples_per_s=speed)",
        ("tests/test_schedules.py", "-k", "more_epochs"),
    ),
    Mutant(
        "weights-of-another-model-unnamed",
        "a checkpoint that does not fit --model names the model it was made with",
        CHECKPOINT,
        'detail += f"; they are of --model {made}" if made != name else ""',
        "pass",
        ("tests/test_robustness.py", "-k", "bad_checkpoints_get_one_line"),
    ),
    Mutant(
        "evaluation-takes-the-short-run-batch",
        "--eval-only without --batch-size takes the answer's batch and says nothing of steps",
        TRAIN,
        "saved = saved or (BATCH_SIZE if args.eval_only else None)",
        "saved = saved or None",
        ("tests/test_schedules.py", "-k", "smaller_batch_and_its_resume"),
    ),
    Mutant(
        "fp16-on-a-cpu-says-nothing",
        "--amp fp16 on a CPU says it is slow",
        TRAIN,
        'print("note: --amp fp16 on a CPU is 10-20x slower than --amp off or bf16")',
        "pass",
        ("tests/test_training_step.py", "-k", "slow"),
    ),
    Mutant(
        "logged-lr-one-step-late",
        "metrics.csv: the rate of the epoch's last step, not the one the schedule set after it",
        TRAIN,
        "row.update(lr=progress.lr, samples_per_s=speed)",
        'row.update(lr=parts.optimizer.param_groups[0]["lr"], samples_per_s=speed)',
        ("tests/test_schedules.py", "-k", "rate_of_each"),
    ),
    Mutant(
        "tensorboard-scalars-without-epochs",
        "TensorBoard: each epoch's scalars at that epoch",
        LOGGER,
        'self.writer.add_scalar(name, value, row["epoch"], walltime)',
        "self.writer.add_scalar(name, value, walltime=walltime)",
        ("tests/test_matrix.py", "-k", "off-sgd-cosine_restarts"),
    ),
    Mutant(
        "model-channels-last-by-another-flag",
        "channels_last: the model's kernels",
        TRAIN,
        "memory_format = torch.channels_last if args.channels_last else torch.preserve_format",
        "memory_format = torch.channels_last if args.compile else torch.preserve_format",
        ("tests/test_matrix.py", "-k", "off-sgd-cosine_restarts"),
    ),
    Mutant(
        "training-batches-not-channels-last",
        "channels_last: the training batches",
        TRAIN,
        "batches = DeviceBatches(train_loader, info, device, args.channels_last)",
        "batches = DeviceBatches(train_loader, info, device, False)",
        ("tests/test_matrix.py", "-k", "off-sgd-cosine_restarts"),
    ),
    Mutant(
        "ema-metrics-of-the-raw-model",
        "EMA: ema_val_ metrics evaluate the average",
        TRAIN,
        "ema_val = run.evaluate(parts.ema.module)",
        "ema_val = run.evaluate(parts.model)",
        ("tests/test_resume.py", "-k", "average_missing"),
    ),
    Mutant(
        "ema-decay-flag-ignored",
        "EMA: --ema-decay",
        TRAIN,
        '"EMA(raw_model, args.ema_decay)"',
        '"EMA(raw_model, 0.999)"',
        ("tests/test_resume.py", "-k", "average_missing"),
    ),
    Mutant(
        "ema-started-again-with-the-default-decay",
        "EMA: an average started on resume takes --ema-decay",
        CHECKPOINT,
        "parts.ema = EMA(parts.raw_model, parts.ema.decay)",
        "parts.ema = EMA(parts.raw_model, 0.999)",
        ("tests/test_resume.py", "-k", "average_missing"),
    ),
    Mutant(
        "epoch-sums-carried-over",
        "train_loss: each epoch's own (its sums start again from 0)",
        TRAIN,
        "        parts.metrics.start_epoch()\n",
        "",
        ("tests/test_robustness.py", "-k", "weights_only_loads"),
    ),
    Mutant(
        "guard-count-not-resumed",
        "nonfinite_steps: a resumed epoch counts the steps skipped before the checkpoint",
        CHECKPOINT,
        '    if "guard" in checkpoint:',
        "    if False:",
        ("tests/test_robustness.py", "-k", "counts_the_bad_steps"),
    ),
    Mutant(
        "lr-sweep-stops-a-step-short",
        "LR finder: the sweep reaches --find-lr-end at its last step",
        FINDERS,
        "growth = (end / start) ** (1 / (steps - 1))",
        "growth = (end / start) ** (1 / steps)",
        ("tests/test_finders.py", "-k", "starts_too_high"),
    ),
    Mutant(
        "lr-sweep-goes-on-past-divergence",
        "LR finder: the sweep stops where the smoothed loss climbs back half way to its start",
        FINDERS,
        "if has_diverged(losses, smoothed):",
        "if not math.isfinite(smoothed[-1]):",
        ("tests/test_finders.py", "-k", "starts_too_high"),
    ),
    Mutant(
        "gradients-zero-filled",
        "gradients freed after each step (set_to_none), not filled with zeros",
        TRAIN,
        "    parts.optimizer.zero_grad(set_to_none=True)",
        "    parts.optimizer.zero_grad(set_to_none=False)",
        ("tests/test_training_step.py", "-k", "accumulated"),
    ),
    Mutant(
        "bf16-autocast-inverted",
        "AMP: --amp bf16 runs the forward passes in bfloat16, --amp off in float32",
        TRAIN,
        'dtype = torch.bfloat16 if args.amp == "bf16" else None',
        'dtype = torch.bfloat16 if args.amp != "bf16" else None',
        ("tests/test_matrix.py", "-k", "bf16-adam-step"),
    ),
    # Issue 27: start-up
    Mutant(
        "determinism-switched-on-every-start",
        "start-up: the compiler is imported only when --deterministic asks for it",
        UTILS,
        "    if deterministic != torch.are_deterministic_algorithms_enabled():",
        "    if True:",
        ("tests/test_loading.py", "-k", "compiler"),
    ),
    # Issue 27: the in-memory path
    Mutant(
        "memory-batches-own-shuffle",
        "in memory: whole batches in the sampler's (seed, epoch) order, its DDP share and start",
        DATA,
        "order = torch.tensor([index for index, _ in self.sampler], device=self.inputs.device)",
        "order = torch.randperm(len(self.inputs), device=self.inputs.device)",
        ("tests/test_in_memory.py",),
    ),
    Mutant(
        "memory-batches-keep-a-partial-batch",
        "in memory: the last, partial batch is dropped, as the loader path drops it",
        DATA,
        "order.split(self.batch_size)[: len(self)]",
        "order.split(self.batch_size)",
        ("tests/test_in_memory.py", "-k", "loader_paths"),
    ),
    Mutant(
        "memory-batches-length-ignores-resume",
        "in memory: an epoch resumed part-way has only the batches left",
        DATA,
        "        return len(self.sampler) // self.batch_size",
        "        return self.sampler.length // self.batch_size",
        ("tests/test_in_memory.py", "-k", "loader_paths or resumes"),
    ),
    Mutant(
        "memory-path-skips-an-own-getitem",
        "in memory: a data set with a __getitem__ of its own (which may augment) keeps the loader",
        DATA,
        "dataset.tensors if type(dataset).__getitem__ is TensorDataset.__getitem__ else None",
        'getattr(dataset, "tensors", None)',
        ("tests/test_data_mistakes.py", "-k", "tensors"),
    ),
    Mutant(
        "memory-targets-unchecked",
        "in memory: every target is checked before training, as the loader checks each batch",
        DATA,
        "        if problem := input_problem(tensors[0]) or target_problem(tensors[1], info):",
        "        if problem := input_problem(tensors[0]):",
        ("tests/test_in_memory.py", "-k", "target"),
    ),
    Mutant(
        "memory-inputs-unchecked",
        "in memory: inputs that are not finite are refused before training, in one line",
        DATA,
        "        if problem := input_problem(tensors[0]) or target_problem(tensors[1], info):",
        "        if problem := target_problem(tensors[1], info):",
        ("tests/test_in_memory.py", "-k", "every_target"),
    ),
    Mutant(
        "float16-inputs-kept",
        "float16 inputs reach the model as float32",
        DATA,
        "        elif inputs.dtype != self.dtype:",
        "        elif inputs.dtype not in (self.dtype, torch.float16):",
        ("tests/test_in_memory.py", "-k", "float64"),
    ),
    Mutant(
        "data-info-std-unchecked",
        "a DataInfo whose std is not positive and finite is refused in one line",
        DATA,
        "    elif info.mean is not None and not all(0 < s < math.inf for s in info.std):",
        "    elif False:",
        ("tests/test_data_mistakes.py", "-k", "statistics"),
    ),
    Mutant(
        "one-class-trains",
        "num_classes below 2 is refused for the default cross-entropy",
        DATA,
        "    if classes < 2:",
        "    if False:",
        ("tests/test_data_mistakes.py", "-k", "one_class"),
    ),
    Mutant(
        "missing-validation-set-traceback",
        "a data set without a validation set is one line",
        DATA,
        "    if val_set is None:",
        "    if False:",
        ("tests/test_data_mistakes.py", "-k", "no_validation"),
    ),
    Mutant(
        "in-memory-validation-with-workers",
        "in memory: no loader processes for the validation set either",
        DATA,
        "    if in_memory(val_set) is not None:  # held in memory",
        "    if False:  # held in memory",
        ("tests/test_in_memory.py", "-k", "loader_paths"),
    ),
    Mutant(
        "in-memory-validation-starves-training",
        "in memory: a validation set in memory leaves the training loader its workers",
        DATA,
        "{% endif %}**val_options)",
        "{% endif %}**(options := val_options))",
        ("tests/test_in_memory.py", "-k", "loader_paths"),
    ),
    Mutant(
        "float64-inputs-kept",
        "float64 inputs (NumPy's default) reach the model as float32",
        DATA,
        "        elif inputs.dtype != self.dtype:",
        "        elif not inputs.is_floating_point():",
        ("tests/test_in_memory.py", "-k", "float64"),
    ),
    Mutant(
        "float64-targets-kept",
        "float64 targets reach the loss as float32",
        DATA,
        "        targets = targets.float() if targets.dtype == torch.float64 else targets",
        "        targets = targets",
        ("tests/test_in_memory.py", "-k", "float64"),
    ),
    # Issue 26: mutants written before looking at the tests
    Mutant(
        "evaluation-averages-over-batches",
        "evaluation: metrics are means over the samples, not over the batches",
        TRAIN,
        "        count += len(targets)",
        "        count += 1",
        ("tests/test_ddp.py", "-k", "evaluation_counts"),
    ),
    Mutant(
        "short-last-window-never-steps",
        "accumulation: the last window of an epoch may be short, and still steps",
        TRAIN,
        "for start in range(progress.batch, total, args.accum_steps):",
        "for start in range(progress.batch, total - args.accum_steps + 1, args.accum_steps):",
        ("tests/test_schedules.py", "-k", "train_py_steps"),
    ),
    Mutant(
        "resumed-epoch-forgets-its-done-batches",
        "accumulation: a part-way resume keeps the epoch's windows where they were",
        TRAIN,
        "total = progress.batch + len(run.batches)",
        "total = len(run.batches)",
        ("tests/test_resume.py", "-k", "kill_9_anywhere"),
    ),
    Mutant(
        "evaluation-in-train-mode",
        "evaluation with the model in eval mode (BatchNorm's running statistics, untouched)",
        TRAIN,
        "    model.eval()\n",
        "    model.train()\n",
        ("tests/test_ddp.py", "-k", "evaluation_counts"),
    ),
    Mutant(
        "training-stays-in-eval-mode",
        "each epoch trains in train mode, also after the evaluation of the one before",
        TRAIN,
        "    parts.model.train()\n",
        "",
        ("tests/test_resume.py", "-k", "kill_9_anywhere"),
    ),
    Mutant(
        "cpu-autocasts-by-default",
        "mixed precision: the answer's amp on GPUs, off on CPUs unless --amp asks",
        TRAIN,
        'args.amp = "{{ amp }}" if device.type == "cuda" else "off"',
        'args.amp = "{{ amp }}"',
        ("tests/test_training_step.py", "-k", "float32"),
    ),
    Mutant(
        "train-loss-accumulates-across-epochs",
        "train_loss: each epoch's own mean, the sums started again every epoch",
        TRAIN,
        "        parts.metrics.start_epoch()\n",
        "",
        ("tests/test_metrics_history.py", "-k", "mean_of_its_epochs"),
    ),
    Mutant(
        "validation-set-of-training-images",
        "the synthetic validation set is made of other images than the training set",
        DATA,
        'val_set = SyntheticImages(max(args.synthetic_size // 5, 1), size, split="val")',
        'val_set = SyntheticImages(max(args.synthetic_size // 5, 1), size, split="train")',
        ("tests/test_device_data.py", "-k", "their_splits"),
    ),
    Mutant(
        "hflip-zero-ignored",
        "--hflip 0 turns mirroring off for the synthetic set",
        DATA,
        "hflip = 0.5 if args.hflip is None else args.hflip",
        "hflip = args.hflip or 0.5",
        ("tests/test_device_data.py", "-k", "hflip or their_splits"),
    ),
    Mutant(
        "loader-seeds-from-the-global-rng",
        "the training loader has its own generator: the run's random state is not drawn from",
        DATA,
        "generator = torch.Generator().manual_seed(args.seed)",
        "generator = None",
        ("tests/test_resume.py", "-k", "dropout"),
    ),
    Mutant(
        "image-stats-over-the-wrong-dimension",
        "the synthetic set's normalisation: per-channel mean and std",
        DATA,
        "flat = self.images.transpose(0, 1).reshape(3, -1).float()",
        "flat = self.images.reshape(3, -1).float()",
        ("tests/test_device_data.py", "-k", "their_splits"),
    ),
    Mutant(
        "residual-zero-init-on-the-wrong-norm",
        "ResNet: each residual branch starts at zero (its last BatchNorm's weight)",
        f"{PKG}/models.py.jinja",
        "nn.init.zeros_(self.bn2.weight)",
        "nn.init.zeros_(self.bn1.weight)",
        ("tests/test_models.py",),
    ),
    Mutant(
        "fused-sgd-buffers-by-the-wrong-key",
        "fused SGD: momentum buffers start at zeros, not uninitialised memory",
        OPTIM,
        'optimizer.defaults.get("fused"):',
        'optimizer.defaults.get("foreach"):',
        ("tests/test_robustness.py", "-k", "leaves_model_and_optimizer"),
    ),
    Mutant(
        "cosine-floor-one-step-late",
        "warmup_cosine: the floor is reached at the last step",
        SCHEDULE,
        "max(1, total - 1 - warmup)",
        "max(1, total - warmup)",
        ("tests/test_schedules.py", "-k", "cosine"),
    ),
    Mutant(
        "cyclic-default-floor-too-low",
        "cyclical LR: the bottom of each cycle is lr / 10 by default",
        SCHEDULE,
        "else args.lr / 10,",
        "else args.lr / 100,",
        ("tests/test_schedules.py", "-k", "cyclic"),
    ),
    Mutant(
        "restarted-schedule-too-long",
        "--more-epochs restart: the new schedule spans the epochs left",
        CHECKPOINT,
        'return saved["epoch"], args.epochs - saved["epoch"]',
        'return saved["epoch"], args.epochs',
        ("tests/test_schedules.py", "-k", "more_epochs"),
    ),
    Mutant(
        "older-metrics-lose-their-last-row",
        "metrics.csv of an older release keeps every row up to the checkpoint's epoch",
        LOGGER,
        'if row["epoch"] <= epoch]',
        'if row["epoch"] < epoch]',
        ("tests/test_metrics_history.py", "-k", "older"),
    ),
    Mutant(
        "flag-bounds-open-and-closed-swapped",
        "flags: a closed bound takes its end, an open one refuses it",
        UTILS,
        "too_high = value >= high if high_open else value > high",
        "too_high = value > high if high_open else value >= high",
        ("tests/test_robustness.py", "-k", "just_inside or bad_flag"),
    ),
    Mutant(
        "temporary-suffix-out-of-step",
        "a save killed half-way leaves no temporary file behind once the run starts again",
        UTILS,
        '{secrets.token_hex(6)}.tmp")',
        '{secrets.token_hex(6)}.part")',
        ("tests/test_robustness.py", "-k", "kill_9_during"),
    ),
    Mutant(
        "batch-finder-sample-draws-from-the-run",
        "--batch-size auto leaves the run's random state alone (the sample's augmentation too)",
        FINDERS,
        "    with own_random_state(device):  # the sample's augmentation draws too\n"
        "        inputs, targets = sample(train_set)",
        "    inputs, targets = sample(train_set)",
        ("tests/test_finders.py", "-k", "batch_size_auto_leaves"),
    ),
    Mutant(
        "ema-decay-changes-on-resume",
        "a resume goes on with the checkpoint's --ema-decay, as with its other state flags",
        CHECKPOINT,
        ' + (["ema_decay"] if ema else []) %}',
        " %}",
        ("tests/test_matrix.py", "-k", "render_lint_and_train"),
    ),
    Mutant(
        "speed-report-ends-on-a-data-refusal",
        "speed report: a speed-up the data cannot take is listed as not tried, not an error",
        SPEED,
        "except (RuntimeError, MemoryError, UserError) as error:",
        "except (RuntimeError, MemoryError) as error:",
        ("tests/test_speed_report.py", "-k", "cannot_take"),
    ),
    Mutant(
        "lr-auto-trains-on-a-guess",
        "--lr auto trains nothing on a sweep whose loss was lowest at its very start",
        FINDERS,
        "    if sweep.guess and not args.find_lr:",
        "    if False:",
        ("tests/test_finders.py", "-k", "starts_too_high"),
    ),
    Mutant(
        "eval-only-without-the-average",
        "EMA: --eval-only reports the average's metrics beside the weights'",
        TRAIN,
        '"".join(f"  ema_val_{name} {value:.6f}" for name, value in averaged)',
        '""',
        ("tests/test_ema.py", "-k", "eval_only"),
    ),
    Mutant(
        "notice-while-starting-lost",
        "preemption: a SIGTERM while the run starts (ignored by a launcher) still stops it, saved",
        TRAIN,
        "{% if preemption %}@holding_signals",
        "{% if preemption %}",
        ("tests/test_resume.py", "-k", "notice_while"),
    ),
    Mutant(
        "finished-run-leaves-metrics-missing",
        "a finished run started again puts back a missing metrics.csv",
        TRAIN,
        LOGGER_LINE + NOTHING_TO_DO,
        NOTHING_TO_DO + LOGGER_LINE,
        ("tests/test_metrics_history.py", "-k", "finished"),
    ),
    Mutant(
        "model-fit-unchecked",
        "a model that does not fit the data's inputs is refused in one line before training",
        f"{PKG}/models.py.jinja",
        "            model.eval()(torch.zeros(2, *info.input_shape, device=device, "
        "dtype=info.dtype))",
        "            pass",
        ("tests/test_data_mistakes.py", "-k", "does_not_fit"),
    ),
    Mutant(
        "model-check-leaves-eval-mode",
        "the model check leaves the model in the mode it found it in",
        f"{PKG}/models.py.jinja",
        "        model.train(training)\n",
        "        pass\n",
        ("tests/test_data_mistakes.py", "-k", "scalar"),
    ),
    Mutant(
        "mlp-refuses-scalar-inputs",
        "the built-in mlp takes inputs of one number each",
        f"{PKG}/models.py.jinja",
        "return self.net(x if x.ndim > 1 else x[:, None])",
        "return self.net(x)",
        ("tests/test_data_mistakes.py", "-k", "scalar"),
    ),
    Mutant(
        "eval-only-takes-the-lock",
        "--eval-only takes no lock: it evaluates beside the run that trains",
        TRAIN,
        "    if not args.eval_only and (problem := hold_out_dir(out_dir)):",
        "    if problem := hold_out_dir(out_dir):",
        ("tests/test_robustness.py", "-k", "eval_only_runs_beside"),
    ),
    Mutant(
        "leftover-cleanup-takes-the-users-files",
        "a run clears its own temporary files from <out-dir>, not the user's that end in .tmp",
        UTILS,
        'out_dir.glob(".*." + "[0-9a-f]" * 12 + ".tmp")',
        'out_dir.glob(".*.tmp")',
        ("tests/test_robustness.py", "-k", "second_run_into_the_same"),
    ),
    Mutant(
        "temporary-name-out-of-step-with-the-cleanup",
        "the cleanup recognises write_atomically's temporary names",
        UTILS,
        "secrets.token_hex(6)",
        "secrets.token_hex(5)",
        ("tests/test_robustness.py", "-k", "kill_9_during"),
    ),
    Mutant(
        "workers-per-gpu-from-the-world-size",
        "DDP: loader workers share this machine's CPUs among this machine's processes",
        DISTRIBUTED,
        'os.environ.get("LOCAL_WORLD_SIZE", 1)',
        'os.environ.get("WORLD_SIZE", 1)',
        ("tests/test_loading.py", "-k", "share"),
    ),
    Mutant(
        "non-finite-flags-summed-over-processes",
        "DDP: a flag raised on any process is 1 on all (the largest, not the sum)",
        DISTRIBUTED,
        "op=dist.ReduceOp.MAX",
        "op=dist.ReduceOp.SUM",
        ("tests/test_ddp.py", "-k", "non_finite_on_one_rank"),
    ),
    Mutant(
        "device-batch-seeds-counted-in-samples",
        "on-device data: a part-way resume draws the crops the batch would have drawn",
        DEVICE_DATA,
        "first = self.start // self.batch_size",
        "first = self.start",
        ("tests/test_device_data.py", "-k", "resume_continues_exactly"),
    ),
    Mutant(
        "ema-ramp-restarts-on-resume",
        "EMA: its count of updates (the decay's ramp) is resumed",
        PKG + "/{% if ema %}ema.py{% endif %}",
        'self.updates = state["updates"]',
        "self.updates = 0",
        ("tests/test_ema.py", "-k", "resumes"),
    ),
    Mutant(
        "bad-streak-forgets-across-log-intervals",
        "guard: non-finite steps in a row are counted across --log-interval folds",
        GUARD,
        "torch.where(last_good == 0, self.bad_in_row + in_a_row, in_a_row)",
        "in_a_row",
        ("tests/test_robustness.py", "-k", "stop_the_run"),
    ),
    Mutant(
        "lr-find-csv-columns-swapped",
        "lr_find.csv: its columns hold what its header names",
        FINDERS,
        "zip(sweep.lrs, sweep.losses, sweep.smoothed, strict=True)",
        "zip(sweep.lrs, sweep.smoothed, sweep.losses, strict=True)",
        ("tests/test_finders.py", "-k", "starts_too_high"),
    ),
    Mutant(
        "lamb-second-moment-corrected-by-beta1",
        "LAMB: each moment bias-corrected by its own beta",
        LAMB,
        "bias_correction2 = 1.0 - beta2**step",
        "bias_correction2 = 1.0 - beta1**step",
        ("tests/test_lamb_lars.py", "-k", "lamb"),
    ),
    Mutant(
        "lars-norm-of-the-decayed-gradient",
        "LARS: the local learning rate from the norm of the gradient alone",
        LARS,
        "g_norm = torch.linalg.vector_norm(grad)",
        "g_norm = torch.linalg.vector_norm(d_p)",
        ("tests/test_lamb_lars.py", "-k", "lars"),
    ),
    Mutant(
        "timed-save-clock-never-reset",
        "--save-every-minutes: the period counts from the last save",
        PREEMPTION,
        "        if stop or due:\n            self.last_save",
        "        if stop:\n            self.last_save",
        ("tests/test_ddp.py", "-k", "save_every_minutes"),
    ),
    Mutant(
        "launch-sh-restarts-by-default",
        "scripts/launch.sh: torchrun restarts a failed job only when MAX_RESTARTS asks",
        LAUNCH,
        "restarts=${MAX_RESTARTS:-0}",
        "restarts=${MAX_RESTARTS:-3}",
        ("tests/test_resume.py", "-k", "launch_sh and script"),
    ),
    Mutant(
        "slurm-ignores-nproc-per-node",
        "SLURM: NPROC_PER_NODE sets the processes per task",
        SLURM,
        "${NPROC_PER_NODE:-${SLURM_GPUS_ON_NODE:-1}}",
        "${SLURM_GPUS_ON_NODE:-1}",
        ("tests/test_slurm.py", "-k", "failing"),
    ),
    Mutant(
        "extras-migration-drops-the-finders",
        "migrations: a project of before v0.7.0 keeps every part it had (the finders too)",
        "hooks/migrate.py",
        'extras = ["preemption", "device_data", "guard", "finders"]',
        'extras = ["preemption", "device_data", "guard"]',
        ("tests/test_migrations.py", "-k", "extras"),
    ),
    Mutant(
        "label-smoothing-one-accepted",
        "questions: a label_smoothing of 1 is refused (--label-smoothing would refuse its default)",
        "copier.yml",
        "label_smoothing < 1) %}",
        "label_smoothing <= 1) %}",
        ("tests/test_questions.py", "-k", "bad_answer or bounds"),
    ),
    Mutant(
        "readme-weight-decay-out-of-step",
        "the README's table of flags gives the defaults that --help gives",
        "template/README.md.jinja",
        "{%- set weight_decay = {'sgd': 5e-4,",
        "{%- set weight_decay = {'sgd': 1e-4,",
        ("tests/test_matrix.py", "-k", "off-sgd-warmup_cosine"),
    ),
    # Issue 27: the LR range test
    Mutant(
        "lr-finder-divergence-at-4x-the-lowest",
        "LR finder: a loss climbing back half way to its start is divergence, whatever its scale",
        FINDERS,
        "smoothed[-1] > lowest + CLIMB * (start - lowest)",
        "smoothed[-1] > 4 * lowest",
        ("tests/test_finders.py", "-k", "climbs_back"),
    ),
    Mutant(
        "lr-finder-divergence-in-the-noise",
        "LR finder: the lowest loss counts once it is clear of the first batches' noise",
        FINDERS,
        "start - lowest > CLEAR * spread and",
        "start - lowest > 0 and",
        ("tests/test_finders.py", "-k", "climbs_back"),
    ),
    Mutant(
        "lr-finder-suggests-a-third",
        "LR finder: a tenth of the rate at the lowest loss, the rule nearest the best measured",
        FINDERS,
        'return float(f"{lrs[lowest_step(smoothed)] / 10:.3g}")',
        'return float(f"{lrs[lowest_step(smoothed)] / 3:.3g}")',
        ("tests/test_finders.py", "-k", "climbs_back or starts_too_high"),
    ),
    Mutant(
        "lr-finder-peak-a-tenth",
        "LR finder: with a schedule that decays, the suggestion (its peak) is half the lowest's",
        FINDERS,
        'return float(f"{lrs[lowest_step(smoothed)] / 2:.3g}")',
        'return float(f"{lrs[lowest_step(smoothed)] / 10:.3g}")',
        ("tests/test_finders.py", "-k", "peak_of_the_schedule"),
    ),
    # Issue 27: the hint of a learning rate far off
    Mutant(
        "lr-hint-rise-inverted",
        "the lr hint: too high only when the loss rose by half",
        SCHEDULE,
        "if last > RISEN * first:",
        "if last < RISEN * first:",
        ("tests/test_schedules.py", "-k", "far_off"),
    ),
    Mutant(
        "lr-hint-never-printed",
        "the lr hint: a run whose first epoch shows its lr far off says so",
        SCHEDULE,
        """            if line := self.line(step, epoch_loss, lr):
                print(line)""",
        """            if line := self.line(step, epoch_loss, lr):
                pass""",
        ("tests/test_schedules.py", "-k", "far_off"),
    ),
    Mutant(
        "lr-hint-wrong-way",
        "the lr hint: a rate too low is told to go 10x higher",
        SCHEDULE,
        'word, flag = "low", {% if finders %}"auto" if not self.swept else {% endif %}'
        'f"{lr * 10:g}"',
        'word, flag = "low", {% if finders %}"auto" if not self.swept else {% endif %}'
        'f"{lr / 10:g}"',
        ("tests/test_schedules.py", "-k", "far_off"),
    ),
    Mutant(
        "lr-hint-no-auto",
        "the lr hint: with the finders extra, it names --lr auto",
        SCHEDULE,
        'word, flag = "low", {% if finders %}"auto"',
        'word, flag = "low", {% if finders %}f"{lr * 10:g}"',
        ("tests/test_schedules.py", "-k", "far_off"),
    ),
    Mutant(
        "lr-hint-read-again-on-resume",
        "the lr hint: read once, from the run's first steps; a resumed run does not read it",
        TRAIN,
        "hint = LrHint(progress.step == 0 and not args.init_weights",
        "hint = LrHint(not args.init_weights",
        ("tests/test_schedules.py", "-k", "far_off"),
    ),
    Mutant(
        "lr-hint-read-when-fine-tuning",
        "the lr hint: read only on a run from scratch, not from --init-weights",
        TRAIN,
        "hint = LrHint(progress.step == 0 and not args.init_weights",
        "hint = LrHint(progress.step == 0",
        ("tests/test_schedules.py", "-k", "far_off"),
    ),
    Mutant(
        "lr-finder-constant-loss-diverges",
        "LR finder: first losses all equal are no fall (a floor under their spread)",
        FINDERS,
        "spread = max(spread, abs(start) / 1000)",
        "spread = spread",
        ("tests/test_finders.py", "-k", "does_not_move"),
    ),
    Mutant(
        "ddp-group-left-only-by-train-py",
        "DDP: the process group is left at exit also when a script calls main() (gloo aborts)",
        DISTRIBUTED,
        "it outlives it.\n    atexit.register(cleanup)\n",
        "it outlives it.\n",
        ("tests/test_ddp.py", "-k", "all_reduced"),
    ),
    Mutant(
        "train-terms-not-logged",
        "the loss seam: the terms compute_loss names are logged as train_<name>",
        METRICS,
        'self.names, self.pending = ["loss", *terms], []',
        'self.names, self.pending = ["loss"], []',
        ("tests/test_rendered_suite.py",),
    ),
    Mutant(
        "short-window-scaled-as-a-full-one",
        "accumulation: a short last window steps with the mean gradient of its micro-batches",
        TRAIN,
        "window = min(args.accum_steps, total - start)",
        "window = min(args.accum_steps, total)",
        ("tests/test_training_step.py", "-k", "mean_gradient"),
    ),
    Mutant(
        "collapse-best-not-kept",
        "a collapse is judged from the best val_acc of the run, kept in its checkpoints",
        TRAIN,
        '        progress.best_acc = max(progress.best_acc, row.get("val_acc", 0.0))\n',
        "",
        ("tests/test_training_step.py", "-k", "chance"),
    ),
    Mutant(
        "non-finite-losses-in-train-loss",
        "train_loss: the mean over the finite losses only",
        METRICS,
        "kept = torch.where(finite[:, None], values, 0).sum(0)",
        "kept = values.sum(0)",
        ("tests/test_robustness.py", "-k", "skipped_and_counted"),
    ),
    # The speed report
    Mutant(
        "speed-backward-timed-as-forward",
        "speed report: the phases of a step, each marked where it begins",
        SPEED,
        'model.register_forward_hook(lambda *_: self.mark("backward")),',
        'model.register_forward_hook(lambda *_: self.mark("forward")),',
        ("tests/test_speed_report.py", "-k", "compute_bound"),
    ),
    Mutant(
        "speed-samples-ignore-accumulation",
        "speed report: samples/s counts every micro-batch of a step",
        SPEED,
        "count * variant.batch_size * args.accum_steps / seconds",
        "count * variant.batch_size / seconds",
        ("tests/test_speed_report.py", "-k", "sleepy"),
    ),
    Mutant(
        "speed-never-data-bound",
        "speed report: a step that waits for its batch is data-bound",
        SPEED,
        'bound = "data" if waits >= DATA_BOUND else "compute"',
        'bound = "compute"',
        ("tests/test_speed_report.py", "-k", "sleepy"),
    ),
    Mutant(
        "speed-workers-tried-unchanged",
        "speed report: more loader workers are measured with more workers",
        SPEED,
        'yield trial(name, f"--workers {more}", {"workers": more})',
        'yield trial(name, f"--workers {more}", {"workers": workers})',
        ("tests/test_speed_report.py", "-k", "sleepy"),
    ),
    Mutant(
        "speed-syncs-of-the-loader-counted",
        "speed report: host syncs counted in the step, not in loading its batches",
        SPEED,
        """    batches = list(islice(endless(variant.batches), args.accum_steps))
    counter = SyncCounter(device)
    with counter:
""",
        """    counter = SyncCounter(device)
    with counter:
        batches = list(islice(endless(variant.batches), args.accum_steps))
""",
        ("tests/test_speed_report.py", "-k", "compute_bound"),
    ),
    Mutant(
        "speed-processes-measured-together",
        "speed report: under DDP each process measures its own steps alone",
        SPEED,
        "if process_count() > 1 and not alone:",
        "if process_count() > 1:",
        ("tests/test_speed_report.py", "-k", "slow_one"),
    ),
    Mutant(
        "speed-budget-never-spent",
        "speed report: no speed-up tried once its time budget is spent",
        SPEED,
        "deadline = time.perf_counter() + BUDGET",
        "deadline = time.perf_counter() + BUDGET + 3600",
        ("tests/test_speed_report.py", "-k", "host_sync"),
    ),
    Mutant(
        "speed-report-locks-the-out-dir",
        "speed report: nothing written into --out-dir but the report",
        TRAIN,
        "if not (args.eval_only or args.speed_report) and (problem := hold_out_dir(out_dir)):",
        "if not args.eval_only and (problem := hold_out_dir(out_dir)):",
        ("tests/test_speed_report.py", "-k", "sleepy"),
    ),
]


def copy_of_the_repository(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
            shutil.copytree(source, dest / name, ignore=ignore)
        elif source.exists():
            shutil.copy2(source, dest / name)
    return dest


def apply(mutant: Mutant, repo: Path) -> str | None:
    """Make the change in `repo`; the reason it cannot be made, or None."""
    path = repo / mutant.path
    if not path.is_file():
        return f"{mutant.path} does not exist"
    text = path.read_text()
    found = text.count(mutant.old)
    if found != mutant.occurrences:
        return f"{mutant.path} has its text {found} times, not {mutant.occurrences}"
    path.write_text(text.replace(mutant.old, mutant.new))
    return None


def pytest(repo: Path, tests: tuple[str, ...], jobs: int) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]
    if jobs > 1:
        command += ["-n", str(jobs)]
    # The copy has no git history: the upgrade matrix (tests/test_upgrades.py) takes it here.
    env = {**os.environ, "TEMPLATE_HISTORY": str(ROOT)}
    return subprocess.run(
        [*command, *tests], cwd=repo, capture_output=True, text=True, timeout=1800, env=env
    )


def run_mutant(mutant: Mutant, jobs: int) -> tuple[str, float, str]:
    """('caught' | 'missed' | 'error', seconds, detail)."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mutant-") as folder:
        repo = copy_of_the_repository(Path(folder))
        problem = apply(mutant, repo)
        if problem is not None:
            return "error", 0.0, problem
        result = pytest(repo, mutant.tests, jobs)
    seconds = time.monotonic() - start
    last = (result.stdout.strip().splitlines() or ["no output"])[-1]
    # With -x, pytest-xdist reports the first failure as an interruption (exit status 2).
    if result.returncode in (1, 2) and " failed" in last:
        return "caught", seconds, last
    if result.returncode == 0:
        return "missed", seconds, last
    return "error", seconds, f"pytest exited {result.returncode}: {last}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", dest="keyword", help="only mutants whose name or target has it")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--check", action="store_true", help="only check that each applies")
    parser.add_argument("--jobs", type=int, default=2, help="pytest-xdist workers per mutant")
    args = parser.parse_args(argv)

    names = [m.name for m in MUTANTS]
    duplicates = {name for name in names if names.count(name) > 1}
    if duplicates:
        parser.error(f"mutant names used twice: {', '.join(sorted(duplicates))}")
    chosen = [
        m for m in MUTANTS if not args.keyword or args.keyword in m.name or args.keyword in m.breaks
    ]
    if args.list:
        for m in chosen:
            print(f"{m.name:40} {m.breaks}\n{'':40} tests: {' '.join(m.tests)}")
        return 0
    if args.check:
        with tempfile.TemporaryDirectory(prefix="mutants-") as folder:
            failures = 0
            for m in chosen:
                repo = copy_of_the_repository(Path(folder) / m.name)
                problem = apply(m, repo)
                print(f"{'ok' if problem is None else 'ERROR':6} {m.name}  {problem or ''}")
                failures += problem is not None
        print(f"{len(chosen) - failures} of {len(chosen)} mutants apply")
        return 1 if failures else 0

    outcomes = []
    for m in chosen:
        outcome, seconds, detail = run_mutant(m, args.jobs)
        outcomes.append((m, outcome, seconds))
        print(f"{outcome:7} {seconds:6.1f} s  {m.name:40} {detail}", flush=True)
    caught = sum(outcome == "caught" for _, outcome, _ in outcomes)
    slowest = max(outcomes, key=lambda item: item[2])
    print(f"\nscore: {caught} of {len(outcomes)} mutants caught")
    print(f"slowest: {slowest[0].name}, {slowest[2]:.0f} s")
    for m, outcome, _ in outcomes:
        if outcome != "caught":
            print(f"{outcome}: {m.name} ({m.breaks}); tests: {' '.join(m.tests)}")
    return 0 if caught == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
