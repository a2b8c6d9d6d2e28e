"""The training step, checked by what reaches the weights: gradients clipped to the threshold
(under fp16, unscaled before they are clipped), the schedule advancing only with the steps
that fp16's GradScaler really took, accumulated micro-batches stepping as one large batch,
and label smoothing in the training loss only. The rendered train.py runs in this process,
with `--amp fp16` forced on the CPU where it matters."""

from __future__ import annotations

import functools

import pytest
import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from tests.helpers import inside, read_metrics, render

FLAGS = ["--device", "cpu", "--model", "mlp", "--image-size", "8"]
FLAGS += ["--workers", "0", "--batch-size", "16", "--epochs", "1"]
FP16 = [*FLAGS, "--amp", "fp16"]


@pytest.fixture(scope="module")
def project(template, tmp_path_factory):
    return render(template, tmp_path_factory.mktemp("amp") / "p", amp="fp16", optimizer="adamw")


@pytest.fixture(scope="module")
def sgd_projects(template, tmp_path_factory):
    folder = tmp_path_factory.mktemp("sgd")
    return {amp: render(template, folder / amp, amp=amp) for amp in ("off", "fp16")}


def train_main(project, flags) -> None:
    with inside(project):
        import train

        train.main(flags)


@pytest.mark.parametrize("clip", [1e-3, 0.05])
@pytest.mark.parametrize("amp", ["off", "fp16"])
def test_gradients_are_clipped_to_the_threshold(sgd_projects, tmp_path, amp, clip):
    """Plain SGD (no momentum, no weight decay) moves the weights by lr x gradient, so each
    step's move over its lr is the norm of the gradient it applied: the clipping threshold,
    as the raw gradients are larger. Clipping the scaled gradients would leave them `scale`
    times too small (whether the optimizer or the scaler unscales them afterwards)."""
    applied, before = [], {}

    def params(optimizer):
        return [p for group in optimizer.param_groups for p in group["params"]]

    def pre(optimizer, args, kwargs):
        before["weights"] = [p.detach().clone() for p in params(optimizer)]
        before["lr"] = optimizer.param_groups[0]["lr"]

    def post(optimizer, args, kwargs):
        moves = [p.detach() - w for p, w in zip(params(optimizer), before["weights"], strict=True)]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(m) for m in moves]))
        if norm > 0:  # 0: a step the scaler skipped (overflowing fp16 gradients)
            applied.append(norm.item() / before["lr"])

    hooks = [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]
    try:
        flags = [*(FP16 if amp == "fp16" else FLAGS), "--synthetic-size", "160"]
        flags += ["--clip-grad", str(clip), "--lr", "1"]
        flags += ["--momentum", "0", "--weight-decay", "0", "--out-dir", str(tmp_path)]
        train_main(sgd_projects[amp], flags)
    finally:
        for hook in hooks:
            hook.remove()
    assert len(applied) >= 5, applied
    assert applied == pytest.approx([clip] * len(applied), rel=2e-2)


def test_steps_the_scaler_skipped_count_in_the_schedule_and_resume_exactly(
    project, tmp_path, monkeypatch
):
    """A scaler that starts far too high overflows the fp16 gradients for its first steps and
    skips them. The schedule counts the loop's steps, skipped or not (as the guard's skips),
    so a run resumed from an epoch's end goes on where the uninterrupted one is: the same
    learning rate and the same weights."""
    monkeypatch.setattr(
        torch.amp, "GradScaler", functools.partial(torch.amp.GradScaler, init_scale=2.0**28)
    )
    flags = [*FP16, "--synthetic-size", "320", "--deterministic"]
    whole, split = tmp_path / "whole", tmp_path / "split"
    train_main(project, [*flags, "--epochs", "2", "--out-dir", str(whole)])
    with inside(project):  # the same run, killed once epoch 1's checkpoint is written
        import train

        saved = train.save_state

        def save_then_die(path, *args):
            saved(path, *args)
            if path.name == "last.pt":
                raise SystemExit("killed")

        monkeypatch.setattr(train, "save_state", save_then_die)
        with pytest.raises(SystemExit):
            train.main([*flags, "--epochs", "2", "--out-dir", str(split)])
    assert torch.load(split / "last.pt", weights_only=True)["progress"]["epoch"] == 1
    train_main(project, [*flags, "--epochs", "2", "--out-dir", str(split)])
    state, resumed = (torch.load(run / "last.pt", weights_only=True) for run in (whole, split))
    loop_steps = state["progress"]["step"]
    taken = int(state["optimizer"]["state"][0]["step"])  # AdamW counts the steps it takes
    assert 0 < taken < loop_steps, (taken, loop_steps)  # some were skipped, not all
    assert state["scheduler"]["last_epoch"] == loop_steps == 40  # 2 epochs of 20 steps
    assert state["scaler"]["scale"] < 2.0**28
    assert resumed["scheduler"] == state["scheduler"]
    assert resumed["scaler"] == state["scaler"]
    assert state["model"].keys() == resumed["model"].keys()
    assert all(torch.equal(state["model"][k], resumed["model"][k]) for k in state["model"])


def test_a_cpu_trains_in_float32_unless_amp_asks(project, tmp_path, monkeypatch):
    """--amp defaults to the answer's precision on GPUs only: the fp16 project run on a CPU
    without --amp computes its outputs in float32, with the GradScaler disabled."""
    dtypes = []
    with inside(project):
        import train

        real = train.compute_loss

        def spy(outputs, *args):
            dtypes.append(outputs.dtype)
            return real(outputs, *args)

        monkeypatch.setattr(train, "compute_loss", spy)
        train.main([*FLAGS, "--synthetic-size", "32", "--out-dir", str(tmp_path)])
    state = torch.load(tmp_path / "last.pt", weights_only=True)
    assert dtypes == [torch.float32] * 2  # 2 steps of 16 images
    assert state["args"]["amp"] == "off" and state["scaler"] == {}


def test_fp16_asked_for_on_a_cpu_is_said_to_be_slow(project, tmp_path, capsys):
    """CPUs have no fast float16 kernels (a small conv net's step here: 24x float32's time),
    so --amp fp16 there says so once; bf16 and off say nothing."""
    note = "note: --amp fp16 on a CPU is 10-20x slower than --amp off or bf16\n"
    for amp in ("fp16", "bf16", "off"):
        flags = [*FLAGS, "--synthetic-size", "32", "--amp", amp, "--epochs", "1"]
        train_main(project, [*flags, "--out-dir", str(tmp_path / amp)])
        assert capsys.readouterr().out.count(note) == (amp == "fp16"), amp


def test_accumulated_micro_batches_step_as_one_large_batch(sgd_projects, tmp_path, monkeypatch):
    """Four micro-batches of 8 accumulated make the step that one batch of 32 makes: the
    loader path gives both the same images in the same order (augmentation is seeded per
    image), and the window's loss is the mean over its micro-batches. After each step the
    gradients are freed (set to None), not filled with zeros: the same numbers, less work."""
    zeroed, real_zero_grad = [], torch.optim.Optimizer.zero_grad

    def zero_grad(optimizer, set_to_none=True):
        zeroed.append(set_to_none)
        return real_zero_grad(optimizer, set_to_none)

    monkeypatch.setattr(torch.optim.Optimizer, "zero_grad", zero_grad)
    flags = [*FLAGS, "--synthetic-size", "128", "--data-on-device", "off", "--deterministic"]
    flags += ["--epochs", "2", "--clip-grad", "0"]  # clipping would hide a gradient 4x off
    whole, accumulated = tmp_path / "whole", tmp_path / "accumulated"
    train_main(sgd_projects["off"], [*flags, "--batch-size", "32", "--out-dir", str(whole)])
    train_main(
        sgd_projects["off"],
        [*flags, "--batch-size", "8", "--accum-steps", "4", "--out-dir", str(accumulated)],
    )
    a = torch.load(whole / "last.pt", weights_only=True)
    b = torch.load(accumulated / "last.pt", weights_only=True)
    assert a["progress"]["step"] == b["progress"]["step"] == 8
    assert zeroed == [True] * 16
    for name, tensor in a["model"].items():
        torch.testing.assert_close(b["model"][name], tensor, rtol=1e-4, atol=1e-5, msg=name)


def test_each_window_steps_with_the_mean_gradient_of_its_micro_batches(sgd_projects, tmp_path):
    """An epoch of 16 micro-batches with --accum-steps 12 makes windows of 12 and 4. Before
    each optimizer step, every parameter's gradient is the mean of its window's micro-batch
    gradients, computed here again from the inputs, targets and model that compute_loss saw
    and the weights as they are then: the short window's is the mean over its 4 (not their
    sum over 12)."""
    seen, checked = [], []
    with inside(sgd_projects["off"]):
        import train

        real = train.compute_loss

        def spy(outputs, targets, args, inputs, model):
            seen.append((inputs.clone(), targets.clone(), model))
            return real(outputs, targets, args, inputs, model)

        def check(optimizer, *_):
            window, model = seen[:], seen[-1][2]
            seen.clear()
            params = [p for group in optimizer.param_groups for p in group["params"]]
            expected = [torch.zeros_like(p) for p in params]
            for inputs, targets, _ in window:
                loss = torch.nn.functional.cross_entropy(model(inputs), targets)
                for total, grad in zip(expected, torch.autograd.grad(loss, params), strict=True):
                    total += grad / len(window)
            for param, grad in zip(params, expected, strict=True):
                torch.testing.assert_close(param.grad, grad, rtol=1e-5, atol=1e-7)
            checked.append(len(window))

        hook = register_optimizer_step_pre_hook(check)
        try:
            train.compute_loss = spy
            flags = [*FLAGS, "--synthetic-size", "128", "--batch-size", "8", "--clip-grad", "0"]
            train.main([*flags, "--accum-steps", "12", "--out-dir", str(tmp_path)])
        finally:
            hook.remove()
            train.compute_loss = real
    assert checked == [12, 4]


def test_label_smoothing_is_in_the_training_loss_only(sgd_projects, tmp_path, monkeypatch):
    """Every training loss is the smoothed cross-entropy of its batch; validation losses are
    plain, as they are compared across runs. metrics.csv logs their means: the training loss
    over the epoch's 4 steps (added up at each step here, --log-interval 1), the validation
    loss and accuracy over its 12 images."""
    import torch.nn.functional as F

    training, validation, correct = [], [], []
    real = F.cross_entropy

    def spy(logits, targets, *args, **kwargs):
        loss = real(logits, targets, *args, **kwargs)
        smoothed = real(logits.detach().float(), targets, label_smoothing=0.3)
        plain = real(logits.detach().float(), targets)
        if kwargs.get("reduction") == "sum":
            smoothed, plain = smoothed * len(targets), plain * len(targets)
        (training if torch.is_grad_enabled() else validation).append((loss, smoothed, plain))
        if not torch.is_grad_enabled():
            correct.append((logits.argmax(1) == targets).sum().item())
        return loss

    monkeypatch.setattr(F, "cross_entropy", spy)
    flags = [*FLAGS, "--synthetic-size", "64", "--label-smoothing", "0.3", "--log-interval", "1"]
    train_main(sgd_projects["off"], [*flags, "--out-dir", str(tmp_path)])
    assert (len(training), len(validation)) == (4, 1)
    for loss, smoothed, plain in training:
        torch.testing.assert_close(loss.detach(), smoothed)
        assert not torch.isclose(loss.detach(), plain)
    for loss, _, plain in validation:
        torch.testing.assert_close(loss, plain)
    [row] = read_metrics(tmp_path)
    mean = sum(loss.item() for loss, _, _ in training) / len(training)
    assert row["train_loss"] == pytest.approx(mean, rel=1e-12)
    assert row["val_loss"] == pytest.approx(sum(v.item() for v, _, _ in validation) / 12, rel=1e-12)
    assert row["val_acc"] == pytest.approx(100 * sum(correct) / 12, rel=1e-12)


def test_gradients_are_clipped_at_norm_1_by_default(sgd_projects):
    """A rare huge gradient (an outlier in the data) at the peak learning rate can kill every
    unit of a layer for good: the defaults clip (bench/RESULTS.md, time to accuracy)."""
    with inside(sgd_projects["off"]):
        import train

        assert train.get_args_parser().parse_args([]).clip_grad == 1.0


def test_a_run_fallen_back_to_chance_says_so_on_its_epoch_line(sgd_projects, tmp_path):
    def notes(accuracies, chance):
        best, said = 0.0, []
        for acc in accuracies:
            best = max(best, acc)  # as fit keeps it in Progress
            said.append(train.collapse_note({"val_acc": acc}, best, chance=chance))
        return said

    with inside(sgd_projects["off"]):
        import train

        said = notes((12.0, 45.0, 69.8, 30.0, 10.2, 15.0, 8.9), chance=10.0)
        assert [bool(note) for note in said] == [False, False, False, False, True, True, True]
        assert "COLLAPSED to chance, from 69.8" in said[4]
        # Never well above chance (less than 20 points): no note.
        assert not any(notes((60, 68, 50), chance=50.0))
        # A metric_sums of your own without accuracy: nothing to say.
        assert train.collapse_note({"val_loss": 1.0}, 0.0, chance=10.0) == ""
        # The best val_acc is saved with the checkpoint: a resumed run knows it.
        train.main([*FLAGS, "--synthetic-size", "64", "--epochs", "3", "--out-dir", str(tmp_path)])
    best = max(row["val_acc"] for row in read_metrics(tmp_path))
    state = torch.load(tmp_path / "last.pt", weights_only=True)
    assert state["progress"]["best_acc"] == pytest.approx(best, rel=1e-12)
