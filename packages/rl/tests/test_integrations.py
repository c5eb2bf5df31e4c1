"""Integrations of icml25.rl with the libraries a practitioner uses: gymnasium ids and rendering of the grid
mazes, GAS save/load (safetensors + JSON), logging and progress bars of the long-running fits."""

from __future__ import annotations

import io
import json
import logging
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

import icml25.rl  # registers the gymnasium ids
from icml25.kernels import torch_threads
from icml25.rl import (
    GASAgent,
    GridMaze,
    PolicyConfig,
    TabularMDPEnv,
    TabularSFLSVI,
    TDRConfig,
    generate_stitch_dataset,
    run_episode,
    train_tdr,
    two_branch_chain,
)
from icml25.rl.gas import agent as agent_module
from icml25.rl.gas import tdr as tdr_module
from icml25.rl.maze import CELL_PIXELS, COLORS, ENV_IDS, LAYOUTS, parse_layout


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with torch_threads(1):
        yield


# ----------------------------------------------------------------------------- gymnasium
def test_every_maze_id_is_registered_and_builds_its_layout():
    assert set(ENV_IDS) == {"icml25/GridMaze-v0", *(f"icml25/GridMaze-{n}-v0" for n in LAYOUTS)}
    for env_id, layout in ENV_IDS.items():
        env = gym.make(env_id)
        assert isinstance(env.unwrapped, GridMaze)
        assert np.array_equal(env.unwrapped.walls, parse_layout(layout))
        assert env.spec.max_episode_steps == 200
    env = gym.make("icml25/GridMaze-v0", layout="snake7")
    assert env.unwrapped.shape == (7, 7)
    icml25.rl.maze.register_envs()  # idempotent: no "overriding environment" warning, same spec
    assert gym.spec("icml25/GridMaze-v0").kwargs == {"layout": "giant15", "max_episode_steps": None}


def test_gym_make_time_limit_is_the_step_budget():
    env = gym.make("icml25/GridMaze-snake7-v0", max_episode_steps=7)
    env.reset(seed=0, options={"start": (1, 1), "goal": (5, 5)})
    flags = [env.step(2)[2:4] for _ in range(7)]  # "left" into the wall: the agent never moves
    assert flags == [(False, False)] * 6 + [(False, True)]
    # the env's own budget is off under gymnasium's TimeLimit; built directly it keeps its own
    assert env.unwrapped.max_episode_steps is None
    direct = GridMaze("snake7", max_episode_steps=3)
    direct.reset(options={"start": (1, 1), "goal": (5, 5)})
    assert [direct.step(2)[3] for _ in range(3)] == [False, False, True]


@pytest.mark.parametrize("render_mode", [None, "ansi", "rgb_array"])
def test_check_env_passes_without_warnings(render_mode):
    env = gym.make("icml25/GridMaze-snake7-v0", render_mode=render_mode)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)


def test_ansi_render_is_the_grid_text():
    env = gym.make("icml25/GridMaze-snake7-v0", render_mode="ansi")
    env.reset(options={"start": (1, 1), "goal": (5, 5)})
    expected = ["#######", "#A....#", "#####.#", "#.....#", "#.#####", "#....G#", "#######"]
    assert env.render() == "\n".join(expected)
    env.step(3)  # right
    assert env.render().splitlines()[1] == "#.A...#"


def test_rgb_array_render_shows_walls_agent_and_goal():
    env = gym.make("icml25/GridMaze-snake7-v0", render_mode="rgb_array")
    env.reset(options={"start": (1, 1), "goal": (5, 5)})
    img = env.render()
    assert img.dtype == np.uint8 and img.shape == (7 * CELL_PIXELS, 7 * CELL_PIXELS, 3)

    def cell(r, c):
        return img[r * CELL_PIXELS : (r + 1) * CELL_PIXELS, c * CELL_PIXELS : (c + 1) * CELL_PIXELS]

    # every pixel of a cell has the colour of its kind
    assert (cell(1, 1) == COLORS["A"]).all() and (cell(5, 5) == COLORS["G"]).all()
    assert (cell(0, 0) == COLORS["#"]).all() and (cell(2, 1) == COLORS["#"]).all()
    assert (cell(1, 2) == COLORS["."]).all()
    # the whole image is the ansi picture, one colour block per character
    text = GridMaze("snake7", render_mode="ansi")
    text.reset(options={"start": (1, 1), "goal": (5, 5)})
    chars = np.array([list(r) for r in text.render().splitlines()])
    colours = np.array([COLORS[ch] for ch in chars.ravel()], dtype=np.uint8).reshape(7, 7, 3)
    assert np.array_equal(img, colours.repeat(CELL_PIXELS, 0).repeat(CELL_PIXELS, 1))
    assert len({tuple(c) for c in COLORS.values()}) == 4  # four distinguishable kinds


def test_agent_on_goal_is_drawn_and_bad_render_mode_is_rejected():
    env = GridMaze("snake7", render_mode="ansi")
    env.reset(options={"start": (1, 1), "goal": (1, 1)})
    assert env.render().splitlines()[1] == "#A....#"
    with pytest.raises(
        ValueError, match="render_mode must be None or one of \\['ansi', 'rgb_array'\\], got 'human'"
    ):
        GridMaze("snake7", render_mode="human")
    with pytest.raises(ValueError, match="max_episode_steps must be a positive int or None, got 0"):
        GridMaze("snake7", max_episode_steps=0)
    quiet = GridMaze("snake7")
    quiet.reset(seed=0)
    with pytest.warns(UserWarning, match="without a render_mode"):
        assert quiet.render() is None


# ----------------------------------------------------------------------------- save / load
@pytest.fixture(scope="module")
def small_agent():
    env = GridMaze("snake7")
    data = generate_stitch_dataset(env, n_trajectories=60, seed=1)
    agent = GASAgent(
        H=6,
        tdr_config=TDRConfig(hidden_dims=(16,), tdr_dim=4, steps=40, batch_size=64, fourier_features=2),
        policy_config=PolicyConfig(hidden_dims=(16,), steps=40, batch_size=64, fourier_features=2),
        seed=3,
    ).fit(data, progress=False)
    return env, data, agent


def _rollout(env, agent, start, goal, steps=25):
    obs, info = env.reset(options={"start": start, "goal": goal})
    agent.reset()
    actions, subgoals = [], []
    for _ in range(steps):
        a = agent.act(obs, info["goal"])
        actions.append(a)
        subgoals.append(agent.subgoal_.copy())
        obs, _, terminated, truncated, info = env.step(a)
        if terminated or truncated:
            break
    return actions, np.array(subgoals)


def test_save_load_round_trips_bit_exactly(small_agent, tmp_path):
    env, _, agent = small_agent
    folder = agent.save(tmp_path / "gas")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    config = json.loads((folder / "config.json").read_text())
    assert config["format"] == "icml25.rl.GASAgent" and config["version"] == 1
    loaded = GASAgent.load(folder)

    for a, b in [(agent.tdr_, loaded.tdr_), (agent.policy_, loaded.policy_)]:
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert loaded.tdr_config == agent.tdr_config and loaded.policy_config == agent.policy_config
    assert (loaded.H, loaded.te_threshold, loaded.seed) == (agent.H, agent.te_threshold, agent.seed)
    for name in ("phi_", "kept_indices_", "node_labels_"):
        assert np.array_equal(getattr(loaded, name), getattr(agent, name))
        assert getattr(loaded, name).dtype == getattr(agent, name).dtype
    g_a, g_b = agent.graph_, loaded.graph_
    assert np.array_equal(g_a.nodes[: g_a.n_base], g_b.nodes)
    assert sorted(g_a.to_networkx().edges(data="weight")) == sorted(g_b.to_networkx().edges(data="weight"))
    obs = env.cell_to_obs(env.free_cells)
    assert np.array_equal(agent.tdr_.encode(obs), loaded.tdr_.encode(obs))
    for start, goal in [((1, 1), (5, 5)), ((5, 1), (1, 5)), ((3, 3), (1, 1))]:
        acts_a, sub_a = _rollout(env, agent, start, goal)
        acts_b, sub_b = _rollout(env, loaded, start, goal)
        assert acts_a == acts_b and np.array_equal(sub_a, sub_b)
    # saving the loaded agent again writes the same tensors
    again = loaded.save(tmp_path / "again")
    assert (again / "model.safetensors").read_bytes() == (folder / "model.safetensors").read_bytes()


def test_save_load_bad_paths_and_files(small_agent, tmp_path):
    _, _, agent = small_agent
    with pytest.raises(ValueError, match="not fitted: call fit\\(dataset\\) before save"):
        GASAgent().save(tmp_path / "x")
    file = tmp_path / "file.txt"
    file.write_text("hello")
    with pytest.raises(NotADirectoryError, match=r"path must be a folder .* got the file"):
        agent.save(file)
    with pytest.raises(TypeError, match=r"path must be a str or os\.PathLike folder, got int 3"):
        agent.save(3)
    with pytest.raises(
        FileNotFoundError, match=r"does not exist: expected a folder written by GASAgent\.save"
    ):
        GASAgent.load(tmp_path / "missing")
    with pytest.raises(NotADirectoryError, match="got the file"):
        GASAgent.load(file)
    with pytest.raises(TypeError, match=r"path must be a str or os\.PathLike"):
        GASAgent.load(None)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=r"has no config\.json"):
        GASAgent.load(empty)

    folder = agent.save(tmp_path / "ok")
    cfg_path, weights = folder / "config.json", folder / "model.safetensors"
    good_cfg, good_weights = cfg_path.read_text(), weights.read_bytes()
    cfg_path.write_text("{not json")
    with pytest.raises(ValueError, match=r"config\.json is not valid JSON"):
        GASAgent.load(folder)
    cfg_path.write_text(json.dumps({**json.loads(good_cfg), "format": "something-else"}))
    with pytest.raises(ValueError, match=r"must have format 'icml25\.rl\.GASAgent', got 'something-else'"):
        GASAgent.load(folder)
    cfg_path.write_text(json.dumps({**json.loads(good_cfg), "version": 99}))
    with pytest.raises(ValueError, match=r"format version 99; this icml25-rl reads versions 1\.\.1"):
        GASAgent.load(folder)
    cfg_path.write_text(good_cfg)
    weights.write_bytes(b"\x00" * 16)
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        GASAgent.load(folder)
    # weights of another architecture: a clear error, not a half-loaded agent
    bad = json.loads(good_cfg)
    bad["tdr"]["hidden_dims"] = [32]
    weights.write_bytes(good_weights)
    cfg_path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="does not hold a consistent saved GASAgent"):
        GASAgent.load(folder)
    cfg_path.write_text(good_cfg)
    assert GASAgent.load(str(folder)).graph_.n_base == agent.graph_.n_base  # str paths work too


def test_load_leaves_the_global_rng_alone(small_agent, tmp_path):
    _, _, agent = small_agent
    folder = agent.save(tmp_path / "gas")
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    GASAgent.load(folder)
    assert torch.equal(torch.rand(3), expected)


# ----------------------------------------------------------------------------- logging and progress
def test_fits_log_their_stages(small_agent, caplog):
    _, data, _ = small_agent
    cfg = dict(hidden_dims=(8,), steps=10, batch_size=16)
    with caplog.at_level(logging.DEBUG, logger="icml25.rl"):
        GASAgent(H=6, tdr_config=TDRConfig(tdr_dim=3, **cfg), policy_config=PolicyConfig(**cfg)).fit(
            data, progress=False
        )
    by_logger = {}
    for rec in caplog.records:
        by_logger.setdefault(rec.name, []).append(rec.getMessage())
    assert by_logger["icml25.rl.gas.agent"][0].startswith(f"GAS fit: {len(data['observations'])} transitions")
    assert any(m.startswith("GAS key graph: TE filter kept") for m in by_logger["icml25.rl.gas.agent"])
    assert by_logger["icml25.rl.gas.tdr"][0].startswith("TDR training: 10 steps, batch 16, ")
    assert sum(m.startswith("TDR step ") for m in by_logger["icml25.rl.gas.tdr"]) == 10  # every steps // 10
    assert by_logger["icml25.rl.gas.tdr"][-1].startswith("TDR trained: final batch loss")
    assert by_logger["icml25.rl.gas.policy"][-1].startswith("policy trained: final batch loss")
    assert any("strongly connected components" in m for m in by_logger["icml25.rl.gas.graph"])

    mdp = two_branch_chain()
    agent = TabularSFLSVI(mdp.n_states, mdp.n_actions, mdp.H, seed=0)
    with caplog.at_level(logging.DEBUG, logger="icml25.rl"):
        caplog.clear()
        episode = run_episode(TabularMDPEnv(mdp), agent, seed=0)
        agent.fit([episode])
    messages = [r.getMessage() for r in caplog.records if r.name == "icml25.rl.sf_lsvi.agents"]
    assert messages[0].startswith(f"TabularSFLSVI update: episode of {len(episode)} steps")
    assert messages[-1] == f"TabularSFLSVI fit: 1 episodes, {len(episode)} transitions, H={mdp.H}, 4 moments"


class _FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_defaults_to_auto_and_is_quiet_in_ci(small_agent, monkeypatch):
    _, data, _ = small_agent
    cfg = TDRConfig(hidden_dims=(8,), tdr_dim=3, steps=5, batch_size=16)
    assert tdr_module.progress_kwargs(None) == {"disable": None, "delay": tdr_module.AUTO_PROGRESS_DELAY}
    assert tdr_module.progress_kwargs(True) == {"disable": False}
    with pytest.raises(TypeError, match="progress must be True, False or None, got str 'yes'"):
        train_tdr(data, cfg, progress="yes")

    def bar_output(progress, ci):
        fake = _FakeTTY()
        monkeypatch.setattr("sys.stderr", fake)
        if ci:
            monkeypatch.setenv("CI", "true")
        else:
            monkeypatch.delenv("CI", raising=False)
        kwargs = {} if progress == "default" else {"progress": progress}
        train_tdr(data, cfg, **kwargs)
        monkeypatch.undo()
        return fake.getvalue()

    assert "TDR" in bar_output(True, ci=True)  # forced on, even in CI
    assert bar_output(False, ci=False) == ""
    assert bar_output("default", ci=True) == ""  # auto: quiet in CI
    assert bar_output("default", ci=False) == ""  # auto in a terminal: a 5-step fit ends before the delay
    monkeypatch.setattr(tdr_module, "AUTO_PROGRESS_DELAY", 0.0)
    assert "TDR" in bar_output("default", ci=False)  # auto in a terminal: shown once the delay has passed
    # the agent forwards its default (None) to both trainers
    assert agent_module.GASAgent.fit.__defaults__ is None
    assert agent_module.GASAgent.fit.__kwdefaults__ == {"tdr": None, "policy": None, "progress": None}
