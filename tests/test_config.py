"""The config tree: sections owned by their packages, strategy sections on by presence, and the
keys of earlier versions still read (each moved to its new place with one warning line)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.config import MOVED, Config, ConfigError, load_config

OLD = """
[rollout]
group_size = 4
concurrency = 32
screen_size = 2
hard_group_size = 16
balance_by = "kind"
balance_goal = "signal"
balance_floor = 0.1
[trainer]
batch_size = 32
skip_zero_variance = false
fill_batch = true
style = "concat"
tokens_per_microbatch = 4096
minibatches = 2
epochs = 3
advantage = "drgrpo"
eps_clip = 0.1
eps_clip_high = 0.3
behav_cap = 4.0
behav_cap_mode = "clamp"
proximal = "interpolate"
ratio_level = "sequence"
kl_coef = 0.01
entropy_coef = 0.001
loss_agg = "seq_mean"
checkpoint_every = 7
keep_checkpoints = 3
train_per_group = 3
unsolved_advantage = -0.5
unsolved_share = 0.5
max_steps = 10
[trainer.optim]
lr = 1e-5
warmup_steps = 4
schedule = "cosine"
min_lr_ratio = 0.2
"""

NEW = """
[rollout]
group_size = 4
concurrency = 32
[rollout.screen]
size = 2
[rollout.retry]
group_size = 16
[rollout.balance]
by = "kind"
goal = "signal"
floor = 0.1
[trainer]
max_steps = 10
[trainer.batch]
size = 32
skip_zero_variance = false
fill = true
style = "concat"
tokens_per_microbatch = 4096
minibatches = 2
epochs = 3
[trainer.loss]
advantage = "drgrpo"
eps_clip = 0.1
eps_clip_high = 0.3
behav_cap = 4.0
behav_cap_mode = "clamp"
proximal = "interpolate"
ratio_level = "sequence"
kl_coef = 0.01
entropy_coef = 0.001
agg = "seq_mean"
[trainer.optim]
lr = 1e-5
[trainer.schedule]
warmup_steps = 4
shape = "cosine"
min_lr_ratio = 0.2
[trainer.checkpoint]
every = 7
keep = 3
[trainer.pods]
keep = 3
[trainer.unsolved]
advantage = -0.5
share = 0.5
"""


def write(tmp_path: Path, text: str, name: str = "config.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_file_of_old_keys_loads_as_the_same_file_in_new_keys(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="areal_config"):
        old = load_config(write(tmp_path, OLD, "old.toml"))
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == len(MOVED), "one warning line per old key"
    for key, moved in MOVED.items():
        assert any(f"{key} is now {moved.new}" in w for w in warnings), key
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="areal_config"):
        new = load_config(write(tmp_path, NEW, "new.toml"))
    assert not caplog.records, "new keys warn about nothing"
    assert old.model_dump() == new.model_dump()


def test_zero_means_off_where_a_strategy_section_replaced_a_number(caplog):
    off = ["trainer.train_per_group=0", "trainer.unsolved_advantage=0", "rollout.screen_size=0"]
    off += ["rollout.hard_group_size=0", 'rollout.balance_by=""']
    with caplog.at_level(logging.WARNING, logger="areal_config"):
        cfg = load_config(None, off)
    assert cfg.trainer.pods is None and cfg.trainer.unsolved is None
    assert cfg.rollout.screen is None and cfg.rollout.retry is None and cfg.rollout.balance is None
    assert "trainer.train_per_group = 0 (off) is now: no [trainer.pods] section" in caplog.text
    on = load_config(None, ["trainer.train_per_group=4", "rollout.screen_size=4", "rollout.hard_group_size=24"])
    assert on.trainer.pods.keep == 4 and on.rollout.screen.size == 4 and on.rollout.retry.group_size == 24


def test_a_setting_of_a_strategy_left_off_stays_off(caplog):
    # Under the old keys unsolved_share did nothing without unsolved_advantage.
    with caplog.at_level(logging.WARNING, logger="areal_config"):
        cfg = load_config(None, ["trainer.unsolved_share=0.5"])
    assert cfg.trainer.unsolved is None
    assert "[trainer.unsolved] got no advantage: it stays off" in caplog.text
    both = load_config(None, ["trainer.unsolved_share=0.5", "trainer.unsolved_advantage=-0.3"])
    assert both.trainer.unsolved.share == 0.5 and both.trainer.unsolved.advantage == -0.3


def test_overrides_win_old_or_new_and_a_file_may_not_set_both(tmp_path):
    path = write(tmp_path, "[trainer.batch]\nsize = 64\n[rollout.screen]\nsize = 2\n")
    assert load_config(path, ["trainer.batch_size=16"]).trainer.batch.size == 16
    assert load_config(path, ["rollout.screen_size=0"]).rollout.screen is None
    assert load_config(path, ["rollout.screen=false"]).rollout.screen is None
    assert load_config(path, ["rollout.screen.size=3"]).rollout.screen.size == 3
    off = write(tmp_path, "[rollout]\nscreen = false\n", "off.toml")
    assert load_config(off, ["rollout.screen.size=3"]).rollout.screen.size == 3
    both = write(tmp_path, "[trainer]\nbatch_size = 16\n[trainer.batch]\nsize = 64\n", "both.toml")
    with pytest.raises(ConfigError, match=r"both trainer.batch_size \(old\) and trainer.batch.size are set"):
        load_config(both)


def test_a_launchers_config_json_round_trips(tmp_path, caplog):
    cfg = load_config(None, ["trainer.pods.keep=4", "rollout.balance.by=kind", "trainer.max_steps=3"])
    path = write(tmp_path, json.dumps(cfg.model_dump(mode="json")), "config.json")
    with caplog.at_level(logging.WARNING, logger="areal_config"):
        again = load_config(path)
    assert again == cfg and not caplog.records


def test_checks_that_span_sections_stay_on_the_root_and_say_the_fix():
    with pytest.raises(ConfigError, match=r"rollout.group_size 8 must divide trainer.batch.size 12"):
        load_config(None, ["trainer.batch.size=12"])
    with pytest.raises(ConfigError, match=r"trainer.schedule.shape 'cosine' decays .* set trainer.max_steps"):
        load_config(None, ["trainer.schedule.shape=cosine"])
    with pytest.raises(ConfigError, match=r"engine.backend = 'vllm' needs engine.urls"):
        load_config(None, ["engine.backend=vllm"])
    with pytest.raises(ConfigError, match=r"trainer.unsolved.advantage: Field required"):
        load_config(None, ["trainer.unsolved.share=0.5"])
    assert Config().trainer.loss.agg == "token_mean"
    assert load_config(None, ["trainer.loss.advantage=drgrpo"]).trainer.loss.agg == "token_sum_norm"


def test_each_section_is_owned_by_its_package_and_stays_light():
    from adapters.config import RolloutConfig
    from proxy import config
    from proxy.engines.config import EngineConfig
    from proxy.store.config import StoreConfig
    from rewards.config import RewardsConfig
    from trainer.config import TrainerConfig
    from trainer.launch.config import RayConfig

    for name, cls in [("engine", EngineConfig), ("store", StoreConfig), ("rewards", RewardsConfig)]:
        assert Config.model_fields[name].annotation is cls and getattr(config, cls.__name__) is cls
    for name, cls in [("trainer", TrainerConfig), ("rollout", RolloutConfig), ("ray", RayConfig)]:
        assert Config.model_fields[name].annotation is cls and getattr(config, cls.__name__) is cls
    cfg = Config()
    assert (cfg.rewards.max_workers, cfg.engine.api_key) == (16, "")
    assert (cfg.store.connect_timeout_s, cfg.store.statement_timeout_s) == (5.0, 30.0)
    script = "import sys, proxy.config; assert 'torch' not in sys.modules, 'a config module imported torch'"
    subprocess.run([sys.executable, "-c", script], check=True)
