"""The registry and `trl_emo.SFTConfig`: names, defaults, validation, third-party losses."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

import trl_emo
import trl_emo.training.config
from trl_emo import SFTConfig
from trl_emo.losses import UnknownLossError, get_loss, list_losses, register_loss, unregister_loss


def make(tmp_path, **kw):
    return SFTConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", **kw)


def test_builtin_losses_and_trl_names_are_listed():
    names = list_losses()
    for name in ("nll", "dft", "gem", "emo", "tailr", "mixce", "ce_entropy"):
        assert name in names
    # Both of TRL's own are registered too (issue 36: outside TRL nobody else computes them), yet stay TRL's in training.
    assert {"nll", "dft"} <= set(list_losses(include_trl=False))


def test_unknown_loss_lists_registered_names(tmp_path):
    with pytest.raises(UnknownLossError) as err:
        get_loss("gemm")
    message = str(err.value)
    assert "'gemm'" in message and "Did you mean 'gem'" in message
    for name in ("emo", "tailr", "mixce", "ce_entropy", "nll", "dft"):
        assert name in message
    with pytest.raises(UnknownLossError, match="Registered loss types"):
        make(tmp_path, loss_type="cross_entropy")


def test_paper_defaults(tmp_path):
    args = make(tmp_path, loss_type="gem")
    assert (args.gem_beta, args.gem_h) == (0.7, "linear")
    assert (args.emo_weighting, args.emo_cost_embedding, args.emo_demd, args.emo_ratio_cap) == ("mle", "frozen", "reference", None)
    assert args.entropy_coef == 0.1
    assert args.loss_implementation == "fused"
    assert args.loss_hyperparameters() == {"beta": 0.7, "h": "linear"}


def test_every_new_field_is_documented():
    doc = SFTConfig.__doc__
    new_fields = set(f.name for f in dataclasses.fields(SFTConfig)) - set(f.name for f in dataclasses.fields(trl_emo.training.config._TRLSFTConfig))
    assert new_fields >= {"gem_beta", "gem_h", "emo_cost_embedding", "emo_weighting", "emo_demd", "emo_ratio_cap",
                          "tailr_gamma", "tailr_min_weight", "mixce_gamma", "entropy_coef", "loss_implementation", "fused_chunk_size", "loss_kwargs"}
    for name in new_fields | {"loss_type"}:
        assert f"{name} (`" in doc, f"{name} has no docstring entry"
        assert SFTConfig.__dataclass_fields__[name].metadata.get("help"), f"{name} has no help"


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("gem_beta", 0.0, "gem_beta"),
        ("gem_beta", 1.5, "gem_beta"),
        ("gem_h", "sigmoid", "gem_h"),
        ("emo_weighting", "balanced", "emo_weighting"),
        ("emo_demd", "exact", "emo_demd"),
        ("emo_ratio_cap", -1.0, "emo_ratio_cap"),
        ("tailr_gamma", 1.2, "tailr_gamma"),
        ("mixce_gamma", -0.1, "mixce_gamma"),
        ("tailr_min_weight", 2.0, "tailr_min_weight"),
        ("entropy_coef", float("nan"), "entropy_coef"),
        ("loss_implementation", "chunked", "loss_implementation"),
        ("fused_chunk_size", 0, "fused_chunk_size"),
        ("loss_kwargs", "{not json", "loss_kwargs"),
    ],
)
def test_bad_values_are_clear_errors_whatever_the_loss(tmp_path, field, value, match):
    # Constructed directly, as a YAML recipe does (argparse `choices` never see these values).
    with pytest.raises(ValueError, match=match):
        make(tmp_path, loss_type="nll", **{field: value})


def test_loss_kwargs_json_and_conflicts(tmp_path):
    @register_loss("test_scaled_nll")
    def scaled(logits, targets, factor=1.0):
        return factor * torch.nn.functional.cross_entropy(logits.float(), targets, reduction="none")

    try:
        args = make(tmp_path, loss_type="test_scaled_nll", loss_kwargs='{"factor": 2.0}')
        assert args.loss_hyperparameters() == {"factor": 2.0}
        with pytest.raises(ValueError, match="gem_beta"):
            make(tmp_path, loss_type="gem", loss_kwargs={"beta": 0.5}).loss_hyperparameters()
    finally:
        unregister_loss("test_scaled_nll")


def test_registration_rules():
    with pytest.raises(ValueError, match="already registered"):
        register_loss("gem", lambda z, y: z.sum(-1))
    with pytest.raises(ValueError, match="TRL"):
        register_loss("dft", lambda z, y: z.sum(-1))
    with pytest.raises(ValueError, match="identifier"):
        register_loss("my-loss", lambda z, y: z.sum(-1))


def test_third_party_validate_runs_in_post_init(tmp_path):
    def check(hp):
        if hp.get("factor", 1.0) <= 0:
            raise ValueError("factor must be positive")

    register_loss("test_checked", lambda z, y, factor=1.0: factor * z.sum(-1), validate=check)
    try:
        with pytest.raises(ValueError, match="factor must be positive"):
            make(tmp_path, loss_type="test_checked", loss_kwargs={"factor": -1})
    finally:
        unregister_loss("test_checked")


def test_public_names():
    for name in ("SFTConfig", "SFTTrainer", "register_loss", "list_losses", "get_loss"):
        assert hasattr(trl_emo, name)
    assert issubclass(trl_emo.SFTTrainer, __import__("trl").SFTTrainer)
    assert issubclass(trl_emo.SFTConfig, __import__("trl").SFTConfig)


def test_bf16_default_follows_the_hardware(tmp_path):
    args = SFTConfig(output_dir=str(tmp_path), report_to="none")
    assert args.bf16 is torch.cuda.is_available()
    assert SFTConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True).bf16 is True  # TRL's default kept


def test_installed_plugins_register_through_their_entry_points(tmp_path, monkeypatch):
    """A package's entry point in `trl_emo.losses` / `trl_emo.evaluation_tasks` is imported once, on first lookup."""
    import importlib.metadata

    from trl_emo.core import plugins
    from trl_emo.evaluation.tasks import task_names

    (tmp_path / "third_party_plugin.py").write_text(
        "import torch\n"
        "from trl_emo.losses import register_loss\n"
        "from trl_emo.evaluation.tasks import EvalTask, register_task\n"
        "IMPORTS = globals().get('IMPORTS', 0) + 1\n"
        "register_loss('plugin_nll', lambda z, y: torch.nn.functional.cross_entropy(z, y, reduction='none'))\n"
        "@register_task\n"
        "class PluginTask(EvalTask):\n"
        "    name = 'plugin_task'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    groups = {
        group: [importlib.metadata.EntryPoint(name="plugin", value="third_party_plugin", group=group)]
        for group in ("trl_emo.losses", "trl_emo.evaluation_tasks")
    }
    asked = []

    def entry_points(group):
        asked.append(group)
        return groups.get(group, [])

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    monkeypatch.setattr(plugins, "_LOADED", set())
    try:
        assert "plugin_nll" in list_losses() and "plugin_nll" in list_losses()
        assert "plugin_task" in task_names()
        assert asked == ["trl_emo.losses", "trl_emo.evaluation_tasks"]
        import third_party_plugin

        assert third_party_plugin.IMPORTS == 1
    finally:
        unregister_loss("plugin_nll")
        from trl_emo.evaluation import tasks

        tasks._TASKS.pop("plugin_task", None)
        sys.modules.pop("third_party_plugin", None)


def test_each_loss_default_is_written_once_and_documented_as_it_is():
    """`LossSpec.defaults` is the one place a built-in loss's defaults are written: `SFTConfig`'s fields take them, and
    its docstring states the same values (a changed default that the documentation still contradicts fails here)."""
    fields = {f.name: f for f in dataclasses.fields(SFTConfig)}
    doc = SFTConfig.__doc__
    checked = 0
    for name in list_losses(include_trl=False):
        spec = get_loss(name)
        assert set(spec.defaults) == set(spec.config_fields), name
        for keyword, attr in spec.config_fields.items():
            default = spec.defaults[keyword]
            assert fields[attr].default == default, (name, attr)
            entry = doc.split(f"\n        {attr} (", 1)[1].split("\n", 1)[0]
            if default is None:
                assert "defaults to" not in entry, (attr, entry)
            else:
                shown = f'"{default}"' if isinstance(default, str) else repr(default)
                assert f"defaults to `{shown}`" in entry, (attr, entry)
            checked += 1
    assert checked >= 14
