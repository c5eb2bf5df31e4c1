"""Tests of P05 GAS (icml25.rl.gas), the grid maze and the offline dataset utilities."""

from __future__ import annotations

import itertools

import networkx as nx
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from icml25.kernels import torch_threads
from icml25.rl import (
    FlatAgent,
    GASAgent,
    GridMaze,
    KeyGraph,
    PolicyConfig,
    TDRConfig,
    generate_stitch_dataset,
    select_subgoal,
    td_cluster,
    te_filter,
    te_filter_dataset,
    train_policy,
    train_tdr,
    validate_offline_dataset,
)
from icml25.rl.datasets import trajectories
from icml25.rl.experiments import gas as experiment
from icml25.rl.gas.policy import (
    DirectionalCritic,
    DirectionalPolicy,
    actor_loss,
    critic_losses,
    normalised_q_loss,
    sample_subgoals,
    waystep_indices,
)
from icml25.rl.gas.tdr import expectile_loss, sample_tdr_goals

# Arc-length (steps from the top-left cell) along the 7x7 serpentine: an exact temporal-distance embedding.
SNAKE_PATH = [(1, c) for c in range(1, 6)] + [(2, 5)] + [(3, c) for c in range(5, 0, -1)] + [(4, 1)]
SNAKE_PATH += [(5, c) for c in range(1, 6)]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # Tiny networks: one intra-op thread is fastest and avoids oversubscribing CI's 2 cores.
    with torch_threads(1):
        yield


# ----------------------------------------------------------------------------- maze and datasets
def test_maze_bfs_and_dynamics():
    env = GridMaze("snake7")
    assert len(env.free_cells) == 17
    d = env.bfs_distances((1, 1))
    assert d[5, 5] == 16 and d[3, 1] == 10 and d[0, 0] == -1
    assert env.distance_matrix().max() == 16
    obs, info = env.reset(seed=0, options={"start": (1, 1), "goal": (1, 4)})
    np.testing.assert_allclose(obs, [1 / 6, 1 / 6])
    obs, r, term, trunc, info = env.step(0)  # up: wall, stays
    assert env.agent.tolist() == [1, 1] and r == 0.0 and not term
    env.step(3)
    obs, r, term, trunc, info = env.step(3)  # (1, 3): one cell from the goal = success
    assert term and r == 1.0 and info["success"] and not trunc
    giant = GridMaze("giant15")
    assert len(giant.free_cells) == 101 and giant.distance_matrix().max() == 50
    assert (giant.distance_matrix() >= 40).sum() == 2 * 176
    medium = GridMaze("maze11")
    assert len(medium.free_cells) == 50 and medium.distance_matrix().max() == 38


def test_maze_truncates_and_rejects_bad_inputs():
    env = GridMaze("snake7", max_episode_steps=3)
    env.reset(options={"start": (1, 1), "goal": (5, 5)})
    outs = [env.step(0) for _ in range(3)]
    assert [o[3] for o in outs] == [False, False, True]
    with pytest.raises(ValueError, match="action"):
        env.step(7)
    with pytest.raises(ValueError, match="free cell"):
        env.reset(options={"start": (0, 0)})
    with pytest.raises(ValueError, match="layout"):
        GridMaze("nope")
    with pytest.raises(ValueError, match="same length"):
        GridMaze(["###", "#.##"])


def test_stitch_dataset_layout_and_legal_moves():
    env = GridMaze("giant15")
    data = generate_stitch_dataset(env, n_trajectories=200, length_range=(8, 12), seed=1)
    data = validate_offline_dataset(data)
    traj = trajectories(data)
    lengths = traj.ends - traj.starts + 1
    assert len(lengths) == 200 and lengths.min() >= 8 and lengths.max() <= 12
    cells, nxt = env.obs_to_cell(data["observations"]), env.obs_to_cell(data["next_observations"])
    # Every transition is the maze's move for the logged action, and consecutive rows chain.
    moved = np.array([env.move(c, a) for c, a in zip(cells, data["actions"])])
    np.testing.assert_array_equal(moved, nxt)
    inner = ~data["terminals"][:-1]
    np.testing.assert_array_equal(nxt[:-1][inner], cells[1:][inner])
    # The walker never bumps into walls (every transition moves to a neighbouring cell).
    assert np.all(np.abs(nxt - cells).sum(1) == 1)
    # Stitch property: no trajectory spans 40 BFS steps (the evaluation distance).
    assert lengths.max() < 40


def _toy_dataset(n=6):
    return {
        "observations": np.arange(2 * n, dtype=np.float32).reshape(n, 2),
        "actions": np.zeros(n, dtype=np.int64),
        "terminals": np.array([0, 0, 1] * (n // 3), dtype=bool),
    }


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda d: d.pop("terminals"), "missing \\['terminals'\\]"),
        (lambda d: d.update(actions=np.zeros(5, dtype=np.int64)), "same length"),
        (lambda d: d["observations"].__setitem__((2, 1), np.nan), "finite.*row 2"),
        (lambda d: d.update(observations=np.zeros(6, dtype=np.float32)), "shape \\(N, obs_dim\\)"),
        (lambda d: d.update(terminals=np.full(6, 3)), "bools"),
        (lambda d: d.update(next_observations=np.zeros((6, 3))), "next_observations"),
        (lambda d: [d.update({k: v[:0]}) for k, v in list(d.items())], "empty"),
    ],
)
def test_dataset_validation_errors(mutate, match):
    data = _toy_dataset()
    mutate(data)
    with pytest.raises(ValueError, match=match):
        validate_offline_dataset(data)


def test_dataset_validation_type_and_warning():
    with pytest.raises(TypeError, match="dict of numpy arrays"):
        validate_offline_dataset([1, 2])
    big = {
        "observations": np.zeros((10_001, 2)),
        "actions": np.zeros(10_001, int),
        "terminals": np.zeros(10_001, bool),
    }
    with pytest.warns(UserWarning, match="ONE trajectory"):
        validate_offline_dataset(big)


def test_trajectories_derive_next_observations():
    traj = trajectories(validate_offline_dataset(_toy_dataset()))
    assert traj.starts.tolist() == [0, 3] and traj.ends.tolist() == [2, 5]
    assert traj.valid.tolist() == [True, True, False, True, True, False]
    assert traj.traj_end.tolist() == [2, 2, 2, 5, 5, 5]
    np.testing.assert_array_equal(traj.next_observations[:2], _toy_dataset()["observations"][1:3])


# ----------------------------------------------------------------------------- TE filter
@settings(max_examples=40, deadline=None)
@given(
    length=st.integers(2, 40),
    H=st.integers(1, 10),
    dim=st.integers(1, 6),
    speed=st.floats(0.3, 3.0),
    seed=st.integers(0, 2**16),
)
def test_te_filter_keeps_straight_lines(length, H, dim, speed, seed):
    direction = np.random.default_rng(seed).normal(size=dim)
    direction /= np.linalg.norm(direction)
    phi = np.arange(length)[:, None] * speed * direction + 5.0
    np.testing.assert_array_equal(te_filter(phi, H, 0.99), np.arange(length))


def test_te_filter_drops_loop():
    # Right along x, a dead-end excursion up 3 and back down, then right again.
    path = [(x, 0) for x in range(11)] + [(10, 1), (10, 2), (10, 3), (10, 2), (10, 1)]
    path += [(x, 0) for x in range(10, 25)]
    phi = np.array(path, dtype=float)
    kept = te_filter(phi, 4, 0.99)
    # Hand-computed (H=4): up to i=6 the 4-step move and the first state 4 away both point right (cos 1);
    # for i=7..14 (approaching, inside and leaving the excursion) the 4-step move bends up or down while the
    # first state 4 away lies ahead along x: cos <= 0.95 < 0.99, dropped; at i=15, (10,1) on the way back,
    # cos((3,-1), (4,-1)) = 0.997 and it is kept again. The last H states are always kept.
    assert kept.tolist() == list(range(7)) + list(range(15, len(path)))
    assert te_filter(phi, 4, -1.0).tolist() == list(range(len(path)))


def test_te_filter_dataset_and_bad_inputs():
    phi = np.vstack([np.arange(10)[:, None] * [1.0, 0.0], np.arange(10)[::-1, None] * [0.0, 1.0]])
    assert te_filter_dataset(phi, np.array([0, 10]), np.array([9, 19]), 3, 0.99).tolist() == list(range(20))
    assert len(te_filter_dataset(phi, np.array([0]), np.array([19]), 3, None)) == 20
    zigzag = np.array([[0.0, 0.0], [1.0, 0.0]] * 200)  # u = 0 for even H: all dropped
    with pytest.warns(UserWarning, match="te_threshold=1.0"):
        te_filter_dataset(np.vstack([zigzag, [[0.0, 9.0]] * 10]), np.array([0]), np.array([409]), 10, 1.0)
    for H in (0, -2, 1.5):
        with pytest.raises(ValueError, match="H"):
            te_filter(phi, H, 0.9)
    for thr in (1.2, -1.01):
        with pytest.raises(ValueError, match="te_threshold"):
            te_filter(phi, 3, thr)
    with pytest.raises(ValueError, match="finite"):
        te_filter(np.full((5, 2), np.nan), 3, 0.9)


# ----------------------------------------------------------------------------- clustering
@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 80), dim=st.integers(1, 4), H=st.floats(0.5, 6.0), seed=st.integers(0, 2**16))
def test_td_cluster_leader_invariants(n, dim, H, seed):
    phi = np.random.default_rng(seed).uniform(0, 10, size=(n, dim))
    centres, leaders, labels = td_cluster(phi, H, return_assignment=True)
    # Every point is within H/2 of the leader it joined; leaders are pairwise farther than H/2.
    assert np.all(np.linalg.norm(phi - phi[leaders][labels], axis=1) <= H / 2 + 1e-12)
    lead = phi[leaders]
    gaps = np.linalg.norm(lead[:, None] - lead[None], axis=-1)[np.triu_indices(len(lead), 1)]
    assert np.all(gaps > H / 2)
    assert leaders[0] == 0 and np.all(labels[leaders] == np.arange(len(leaders)))
    for k in range(len(leaders)):
        np.testing.assert_allclose(centres[k], phi[labels == k].mean(0))
    np.testing.assert_allclose(td_cluster(phi, H), centres)


def test_td_cluster_merges_within_threshold():
    phi = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.4], [10.0, 0.0], [11.4, 0.0]])
    centres, leaders, labels = td_cluster(phi, 3.0, return_assignment=True)
    assert labels.tolist() == [0, 0, 0, 1, 1] and leaders.tolist() == [0, 3]
    np.testing.assert_allclose(centres, [[1 / 3, 1.4 / 3], [10.7, 0.0]])


def test_td_cluster_never_merges_across_a_wall():
    env = GridMaze("snake7")
    cells = np.array(SNAKE_PATH)
    arc = np.arange(len(cells), dtype=float)
    phi = np.stack([arc, np.zeros_like(arc)], axis=1)  # exact temporal distance = BFS distance
    H = 6.0
    _, _, labels = td_cluster(phi, H, return_assignment=True)
    dist = env.distance_matrix()
    ids = np.array([env.cell_id(c) for c in cells])
    for k in np.unique(labels):
        members = ids[labels == k]
        assert dist[np.ix_(members, members)].max() <= H  # within H steps, never through a wall
    same = dict(zip(map(tuple, cells), labels))
    assert same[(1, 1)] != same[(3, 1)]  # adjacent across the wall, 10 steps apart
    # Raw coordinates (in steps) would merge them: the TDR metric is what keeps walls intact.
    _, _, raw_labels = td_cluster(cells.astype(float), H, return_assignment=True)
    raw = dict(zip(map(tuple, cells), raw_labels))
    assert raw[(1, 1)] == raw[(3, 1)]


# ----------------------------------------------------------------------------- key graph
def _room(n: int) -> np.ndarray:
    return np.array(list(itertools.product(range(n), range(n))), dtype=float)


@settings(max_examples=30, deadline=None)
@given(
    start=st.tuples(st.integers(0, 7), st.integers(0, 7)),
    goal=st.tuples(st.integers(0, 7), st.integers(0, 7)),
)
def test_plan_in_open_room_is_shortest_and_monotone(start, goal):
    # Exact phi = grid coordinates; H = 1 keeps only 4-neighbour edges, so graph distance = BFS = L1.
    g = KeyGraph().build(_room(8), H=1.0)
    g.add_goal(np.array(goal, dtype=float))
    path = g.plan(np.array(start, dtype=float))
    # The start node is any node within H minimising (distance + path length): start or a neighbour.
    path = np.vstack([np.array(start, dtype=float), path])
    steps = np.abs(np.diff(path, axis=0)).sum(1)
    assert np.allclose(path[-1], goal)
    assert steps.sum() == pytest.approx(abs(start[0] - goal[0]) + abs(start[1] - goal[1]))
    for axis in range(2):  # monotone toward the goal along both axes
        d = np.diff(path[:, axis]) * np.sign(goal[axis] - start[axis])
        assert np.all(d >= 0)


def test_keygraph_edges_scc_merge_and_goal():
    nodes = np.array([[0.0, 0.0], [2.0, 0.0], [4.0, 0.0], [20.0, 0.0], [22.0, 0.0], [50.0, 0.0]])
    g = KeyGraph().build(nodes, H=3.0)
    G = g.to_networkx()
    assert nx.is_strongly_connected(G)
    for u, v, w in G.edges(data="weight"):  # edges come in pairs and weigh the phi distance
        assert G.has_edge(v, u) and w == pytest.approx(np.linalg.norm(nodes[u] - nodes[v]))
    # Within-H edges plus one closest-pair bridge per merge: 2-4 (16) and 4-5 (28), both ways.
    assert sorted((u, v) for u, v in G.edges if u < v) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]
    gid = g.add_goal(np.array([23.5, 0.0]))
    assert gid == 6 and sorted(G.neighbors(gid)) == [4]  # within max(H, 1.2 * 1.5) = 3
    # Off the line, so that only node 0 is within H of the start (on a line, starts tie).
    idx = g.plan_indices(np.array([-1.0, 1.0]))
    assert idx == [0, 1, 2, 3, 4, 6]
    assert g.path_length(0) == pytest.approx(23.5)
    # Brute force: the stored length equals networkx's shortest-path length from node 0 to the goal.
    assert nx.shortest_path_length(G, 0, gid, weight="weight") == pytest.approx(23.5)
    # Replacing the goal removes the old node.
    assert g.add_goal(np.array([1.0, 0.5])) == 6 and len(g.nodes) == 7 and not G.has_edge(4, 6)
    with pytest.warns(UserWarning, match="farther than H"):
        g.add_goal(np.array([100.0, 0.0]))
    assert sorted(G.neighbors(6)) == [5]  # connected to the nearest through 1.2 * min distance
    assert g.plan(np.array([200.0, 0.0]), force_closest=False) is None


def test_start_node_minimises_distance_plus_path_length():
    nodes = np.array([[0.0, 0.0], [3.0, 0.0], [6.0, 0.0]])
    g = KeyGraph().build(nodes, H=4.0)
    g.add_goal(np.array([8.0, 0.0]))
    # From (0, 1) node 0 (1 + 8) and node 1 (3.16 + 5) are within H = 4: node 1 wins.
    assert g.plan_indices(np.array([0.0, 1.0])) == [1, 2, 3]
    # From (-1, 1) only node 0 (distance 1.41) is within H.
    assert g.plan(np.array([-1.0, 1.0])).tolist() == [[0.0, 0.0], [3.0, 0.0], [6.0, 0.0], [8.0, 0.0]]


def test_select_subgoal_is_farthest_within_h():
    path = np.array([[0.0], [2.0], [4.0], [6.0], [3.0], [9.0]])
    assert select_subgoal(path, np.array([0.0]), 4.0) == 4  # index 4 (x=3) is the last within 4
    assert select_subgoal(path, np.array([0.0]), 1.0) == 0
    assert select_subgoal(path, np.array([100.0]), 1.0) == 0  # none within H -> first node


def test_keygraph_bad_inputs():
    with pytest.raises(ValueError, match="H"):
        KeyGraph().build(np.zeros((2, 2)), H=0)
    with pytest.raises(ValueError, match="H"):
        td_cluster(np.zeros((2, 2)), -1.0)
    with pytest.raises(ValueError, match="shape"):
        KeyGraph().build(np.zeros(3), H=1.0)
    g = KeyGraph().build(np.zeros((2, 3)), H=1.0)
    with pytest.raises(ValueError, match="add_goal"):
        g.plan(np.zeros(3))
    with pytest.raises(ValueError, match=r"phi_g.*shape \(3,\)"):
        g.add_goal(np.zeros(2))
    g.add_goal(np.zeros(3))
    with pytest.raises(ValueError, match=r"phi_s.*\(3,\)"):
        g.plan(np.zeros(4))


# ----------------------------------------------------------------------------- TDR, policy, agent
def test_expectile_loss_and_goal_sampling():
    adv = torch.tensor([1.0, -1.0, 0.0])
    diff = torch.tensor([2.0, 2.0, 1.0])
    assert torch.allclose(expectile_loss(adv, diff, 0.9), torch.tensor([3.6, 0.4, 0.9]))
    rng = np.random.default_rng(0)
    traj_end = np.repeat([9, 19, 29], 10)
    idx = rng.integers(0, 30, size=20_000)
    idx = idx[idx < traj_end[idx]]
    cfg = TDRConfig(p_trajgoal=0.5, p_randomgoal=0.3, p_curgoal=0.2)
    goals = sample_tdr_goals(rng, idx, traj_end, 30, cfg)
    assert np.mean(goals == idx) == pytest.approx(0.2 + 0.3 / 30, abs=0.015)
    future = (goals > idx) & (goals <= traj_end[idx])
    assert np.mean(future) >= 0.5
    with pytest.raises(ValueError, match="sum to 1"):
        TDRConfig(p_trajgoal=0.5, p_randomgoal=0.1)


# ----------------------------------------------------------------------------- the official low-level agent
def test_value_loss_is_the_expectile_closed_form():
    torch.manual_seed(0)
    critic = DirectionalCritic(2, 3, n_actions=4, hidden_dims=(8,))
    target = DirectionalCritic(2, 3, n_actions=4, hidden_dims=(8,))
    obs, nxt = torch.randn(16, 2), torch.randn(16, 2)
    z = nn_normalise(torch.randn(16, 3))
    acts, rewards = torch.randint(0, 4, (16,)), torch.randn(16)
    value_l, critic_l = critic_losses(critic, target, obs, nxt, acts, z, rewards, 0.9, 0.7)
    with torch.no_grad():
        q_bar = torch.minimum(*target.q(obs, z)[:, torch.arange(16), acts])  # min over the 2 heads
        v = critic.v(obs, z)
        u = (q_bar - v).numpy()
        want = np.mean(np.where(u >= 0, 0.7, 0.3) * u**2)  # expectile 0.7: weight 0.7 above, 0.3 below
        y = rewards + 0.9 * critic.v(nxt, z)  # mask 1: the skills never terminate
        q = critic.q(obs, z)[:, torch.arange(16), acts]
        want_critic = ((q[0] - y) ** 2 + (q[1] - y) ** 2).mean()
    assert value_l.item() == pytest.approx(want, rel=1e-5)
    assert critic_l.item() == pytest.approx(want_critic.item(), rel=1e-5)
    # The value is the only trainable input of the value loss; the critic loss leaves V untouched.
    critic_l.backward()
    assert all(p.grad is None for p in critic.value.parameters())


def nn_normalise(x):
    return x / x.norm(dim=-1, keepdim=True)


@given(st.floats(0.1, 100.0), st.integers(0, 10_000))
@settings(max_examples=20, deadline=None)
def test_actor_q_term_is_normalised(scale, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(32, generator=gen) - 0.3
    base = normalised_q_loss(q)
    assert normalised_q_loss(scale * q).item() == pytest.approx(base.item(), rel=1e-4, abs=1e-6)
    assert base.item() == pytest.approx(-(q.mean() / (q.abs().mean() + 1e-6)).item(), rel=1e-6)
    # The |Q| scale is held fixed: the gradient is -1 / (B * mean|q|) for every entry.
    qq = q.clone().requires_grad_(True)
    normalised_q_loss(qq).backward()
    assert torch.allclose(qq.grad, torch.full_like(q, -1.0 / (32 * (q.abs().mean().item() + 1e-6))))


def test_actor_loss_discrete_is_expected_q_plus_alpha_bc():
    torch.manual_seed(1)
    policy = DirectionalPolicy(2, 3, n_actions=4, hidden_dims=(8,))
    critic = DirectionalCritic(2, 3, n_actions=4, hidden_dims=(8,))
    obs, z, acts = torch.randn(10, 2), nn_normalise(torch.randn(10, 3)), torch.randint(0, 4, (10,))
    loss = actor_loss(policy, critic, obs, acts, z, alpha=2.5)
    with torch.no_grad():
        logits = policy(obs, z)
        q = (logits.softmax(-1) * critic.q(obs, z).min(0).values).sum(-1)
        want = -q.mean() / (q.abs().mean() + 1e-6) + 2.5 * torch.nn.functional.cross_entropy(logits, acts)
    assert loss.item() == pytest.approx(want.item(), rel=1e-5)
    loss.backward()  # the critic is held fixed: only the actor learns from the actor loss
    assert all(p.grad is None for p in critic.parameters())
    assert all(p.grad is not None for p in policy.parameters())


def test_actor_loss_continuous_differentiates_through_the_action_only():
    torch.manual_seed(2)
    policy = DirectionalPolicy(2, 3, action_dim=2, hidden_dims=(8,))
    critic = DirectionalCritic(2, 3, action_dim=2, hidden_dims=(8,))
    obs, z, acts = torch.randn(6, 2), nn_normalise(torch.randn(6, 3)), torch.rand(6, 2) * 2 - 1
    loss = actor_loss(policy, critic, obs, acts, z, alpha=1.0)
    loss.backward()
    assert all(p.grad is None for p in critic.parameters()) and all(
        p.requires_grad for p in critic.parameters()
    )
    assert all(p.grad is not None for p in policy.parameters())


def _brute_waysteps(phi, traj_end, H):
    out = []
    for i in range(len(phi)):
        j = i
        while j <= traj_end[i] and np.linalg.norm(phi[j] - phi[i]) < H:
            j += 1
        out.append(j if j <= traj_end[i] else traj_end[i])
    return np.array(out)


@given(st.integers(0, 10_000), st.floats(0.5, 4.0))
@settings(max_examples=30, deadline=None)
def test_waystep_indices_match_brute_force(seed, H):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 9, size=4)
    phi = np.concatenate([np.cumsum(rng.normal(size=(n, 2)), 0) for n in lengths])
    traj_end = np.repeat(np.cumsum(lengths) - 1, lengths)
    assert np.array_equal(waystep_indices(phi, traj_end, H), _brute_waysteps(phi, traj_end, H))


def test_subgoal_sampling_matches_the_enumerated_distribution():
    # A toy trajectory on a line, 1 TDR unit per step, way_steps 3: the cap of row i is i + 3 (or the end).
    phi = np.arange(8, dtype=np.float64)[:, None]
    traj_end = np.full(8, 7)
    ways = waystep_indices(phi, traj_end, 3.0)
    assert ways.tolist() == [3, 4, 5, 6, 7, 7, 7, 7]
    gamma, n = 0.5, 200_000
    for i in (0, 5):
        goals = sample_subgoals(np.random.default_rng(i), np.full(n, i), ways, gamma)
        # Enumerate min(i + k, cap) over the geometric offsets k >= 1, P(k) = (1 - gamma) gamma^(k-1).
        want: dict[int, float] = {}
        for k in range(1, 60):
            g = min(i + k, ways[i])
            want[g] = want.get(g, 0.0) + (1 - gamma) * gamma ** (k - 1)
        got = {int(g): c / n for g, c in zip(*np.unique(goals, return_counts=True))}
        assert set(got) == set(want)
        for g, p in want.items():
            assert got[g] == pytest.approx(p, abs=0.005)


@pytest.mark.parametrize("low_level", ["critic", "bc"])
def test_train_policy_both_low_levels(low_level):
    data = generate_stitch_dataset(GridMaze("snake7"), n_trajectories=30, length_range=(4, 6), seed=0)
    phi = np.asarray(data["observations"], dtype=np.float64) * 10
    cfg = PolicyConfig(hidden_dims=(8,), subgoal_steps=2, steps=20, batch_size=16, low_level=low_level)
    a = train_policy(data, phi, cfg, seed=1)
    b = train_policy(data, phi, cfg, next_phi=np.asarray(data["next_observations"]) * 10, seed=1)
    # Without next_phi the successor's embedding is looked up in phi: here the same values.
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    with pytest.raises(ValueError, match="low_level"):
        PolicyConfig(low_level="iql")
    with pytest.raises(ValueError, match="next_phi must have shape"):
        train_policy(data, phi, cfg, next_phi=phi[:3], seed=1)


@pytest.fixture(scope="module")
def snake():
    """A small GAS trained on the 7x7 serpentine (about 3 s on one core)."""
    env = GridMaze("snake7")
    data = generate_stitch_dataset(env, n_trajectories=150, seed=0)
    cfg = TDRConfig(hidden_dims=(64, 64), steps=300, lr=1e-3, tau=0.05, fourier_features=4)
    tdr = train_tdr(data, cfg, seed=0)
    pol_cfg = PolicyConfig(hidden_dims=(64, 64), steps=300, fourier_features=4)
    agent = GASAgent(H=6, policy_config=pol_cfg, seed=0).fit(data, tdr=tdr)
    return env, data, agent


def test_trained_tdr_tracks_bfs_distance(snake):
    env, _, agent = snake
    phi = agent.tdr_.encode(env.cell_to_obs(env.free_cells))
    d_phi = np.linalg.norm(phi[:, None] - phi[None], axis=-1)
    iu = np.triu_indices(len(phi), 1)
    assert experiment.spearman(d_phi[iu], env.distance_matrix()[iu]) >= 0.9


def test_learned_clusters_respect_walls(snake):
    env, data, agent = snake
    cells = env.obs_to_cell(data["observations"][agent.kept_indices_])
    ids = np.array([env.cell_id(c) for c in cells])
    dist = env.distance_matrix()
    for k in np.unique(agent.node_labels_):
        members = np.unique(ids[agent.node_labels_ == k])
        assert dist[np.ix_(members, members)].max() <= 6  # never (1,1)+(3,1): 10 steps via the corridor
    assert nx.is_strongly_connected(agent.graph_.to_networkx())


def test_gas_agent_reaches_far_goal(snake):
    env, _, agent = snake
    success, visited = experiment.rollout(env, agent, np.array([1, 1]), np.array([5, 5]))
    assert success and len(visited) - 1 <= 30  # BFS distance 16 (success at 15)
    assert agent.kept_fraction_ > 0.3


def test_agent_bad_inputs(snake):
    env, data, agent = snake
    with pytest.raises(ValueError, match="obs must be one observation of shape \\(2,\\)"):
        agent.act(np.zeros(3), np.zeros(2))
    with pytest.raises(ValueError, match="goal must be finite"):
        agent.act(np.zeros(2), np.array([np.nan, 0.0]))
    with pytest.raises(ValueError, match="not fitted"):
        GASAgent().act(np.zeros(2), np.zeros(2))
    with pytest.raises(ValueError, match="H"):
        GASAgent(H=0)
    with pytest.raises(ValueError, match="te_threshold"):
        GASAgent(te_threshold=1.5)
    with pytest.raises(ValueError, match="obs must have shape"):
        agent.tdr_.encode(np.zeros((4, 3)))
    with pytest.raises(ValueError, match="phi must have shape"):
        train_policy(data, np.zeros((5, 16)))
    flat = FlatAgent(agent.tdr_, agent.policy_)
    assert flat.act(env.cell_to_obs(np.array([1, 1])), env.cell_to_obs(np.array([1, 3]))) == 3  # right


def test_trainers_are_reproducible_without_touching_global_rng():
    """The same seed gives the same TDR and policy whatever the caller's global state, which stays as it was."""
    from icml25.kernels.rng import global_rng_state

    data = generate_stitch_dataset(GridMaze("snake7"), n_trajectories=20, length_range=(4, 6), seed=0)
    tdr_cfg = TDRConfig(hidden_dims=(8,), tdr_dim=3, steps=5, batch_size=16)
    pol_cfg = PolicyConfig(hidden_dims=(8,), subgoal_steps=2, steps=5, batch_size=16)

    def train_both(global_seed):
        torch.manual_seed(global_seed)
        np.random.seed(global_seed)  # noqa: NPY002 - the caller's global state, which must not matter
        before = global_rng_state()
        tdr = train_tdr(data, tdr_cfg, seed=3)
        policy = train_policy(data, tdr.encode(data["observations"]), pol_cfg, seed=3)
        assert global_rng_state() == before
        return [*tdr.state_dict().values(), *policy.state_dict().values()]

    a, b = train_both(0), train_both(1)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    other = train_tdr(data, tdr_cfg, seed=4).state_dict().values()
    assert not all(torch.equal(x, y) for x, y in zip(a, other))  # the seed does matter


def test_spearman_exact():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    assert experiment.spearman(x, x**3) == pytest.approx(1.0)
    assert experiment.spearman(x, -x) == pytest.approx(-1.0)
    # Ties get average ranks: ranks (1, 2.5, 2.5, 4) vs (1, 2, 3, 4) -> Pearson of the ranks.
    r = experiment.spearman(np.array([1.0, 2.0, 2.0, 3.0]), x)
    assert r == pytest.approx(np.corrcoef([1, 2.5, 2.5, 4], [1, 2, 3, 4])[0, 1])


# ----------------------------------------------------------------------------- reproduction
@pytest.fixture(scope="module")
def quick_trained():
    """The quick setting's maze, dataset, TDR and policy: the first half of ``run(quick=True, seed=0)``."""
    return experiment.train(experiment.QUICK, seed=0)


ORDER_CHECK = "GAS success >= flat success + 0.5"


def test_threshold_text_is_the_checks():
    assert experiment.threshold(quick=True) == (
        "GAS success >= flat success + 0.5; GAS success >= 0.7; TDR Spearman vs BFS >= 0.9"
    )
    assert experiment.threshold(quick=False) == (
        "GAS success >= flat success + 0.5; GAS success >= 0.8; flat success <= 0.3; TDR Spearman vs BFS >= 0.9"
    )


def test_quick_reproduction(quick_trained, tmp_path):
    # run(quick=True, seed=0) is exactly evaluate(train(QUICK, 0)); the training is shared with the next test.
    report = experiment.evaluate(quick_trained, out_dir=tmp_path)
    assert report.paper == "P05"
    assert report.checks == {
        ORDER_CHECK: True,
        "GAS success >= 0.7": True,
        "TDR Spearman vs BFS >= 0.9": True,
    }
    assert report.passed and all(name in report.threshold for name in report.checks)
    m = report.metrics
    # The quick maze defeats the flat policy (long horizon, fragments of <= 12 steps) and GAS stitches.
    assert m["baseline_flat_success"] <= 0.2 and m["gas_success"] >= m["baseline_flat_success"] + 0.5
    assert m["n_nodes"] >= 15  # the 15x15 maze needs a real key graph, not a handful of nodes
    assert m["te_kept_cell_coverage"] == m["cell_coverage"] == 1.0  # the TE filter removes no cell here
    assert "gas_bc_success" not in m  # the quick mode trains only the gated (official) low level
    assert report.figures and all(f.exists() and f.stat().st_size > 0 for f in report.figures)


class _NoStitchGAS(GASAgent):
    """Broken GAS: the key graph keeps its nodes but loses every edge, so no fragments are stitched (only
    the goal's own edges remain and the planner can only aim at the nodes next to the goal)."""

    def build_graph(self, data):
        graph = super().build_graph(data)
        g = graph.to_networkx()
        g.remove_edges_from(list(g.edges))
        return graph


def test_broken_gas_without_graph_edges_fails_the_quick_gate(quick_trained):
    report = experiment.evaluate(quick_trained, agent_cls=_NoStitchGAS)
    assert report.checks[ORDER_CHECK] is False and not report.passed
    assert report.checks["TDR Spearman vs BFS >= 0.9"]  # same TDR: only the stitching was removed
    assert report.metrics["gas_success"] <= 0.3


@pytest.mark.slow
def test_full_reproduction():
    report = experiment.run(quick=False, seed=0)
    assert report.metrics["gas_success"] >= 0.8
    assert report.metrics["baseline_flat_success"] <= 0.3
    assert report.metrics["gas_success"] >= report.metrics["baseline_flat_success"] + 0.5
    assert report.metrics["tdr_spearman"] >= 0.9
    assert report.passed and len(report.checks) == 4 and all(report.checks.values())
    # The directional-BC low level, reported alongside the official actor-critic (not gated).
    assert report.metrics["gas_bc_success"] >= report.metrics["baseline_flat_bc_success"] + 0.5
