"""Goal-conditioned grid maze with the gymnasium API, and a stitch-style offline dataset generator.

Environment and data of the small-scale reproduction of *GAS: Graph-Assisted Stitching for offline
hierarchical RL* (catalog id P05), usable on its own by any offline goal-conditioned method.

The maze is a character grid (``#`` wall, ``.`` free). The agent occupies one free cell and moves with 4
discrete actions; bumping into a wall leaves it in place. Observations are the normalised cell coordinates
``(row, col) / (size - 1)`` (float32, shape ``(2,)``), the goal is reported in ``info["goal"]`` in the same
form (as OGBench does), and an episode succeeds when the agent is within ``success_radius`` grid steps
(L1) of the goal cell.

``render_mode="ansi"`` renders the grid as text (``#`` wall, ``.`` free, ``G`` goal, ``A`` agent) and
``render_mode="rgb_array"`` as a ``uint8`` image of :data:`CELL_PIXELS` pixels per cell. Importing
:mod:`icml25.rl` registers the mazes with gymnasium (:data:`ENV_IDS`): ``gymnasium.make("icml25/GridMaze-v0")``
(``layout=`` any :data:`LAYOUTS` name or a list of rows) and one id per layout, e.g.
``"icml25/GridMaze-snake7-v0"``; the step budget is gymnasium's ``TimeLimit`` (``max_episode_steps=`` of
``gymnasium.make``, default 200).

The stitch-style generator mimics OGBench's ``*-stitch`` datasets: many short trajectories of a noisy
straight-line walker, so that no single trajectory connects far-apart cells and long-horizon goal reaching
requires stitching fragments together.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from icml25.kernels.checks import check_int

# Action ids -> (d_row, d_col): up, down, left, right.
ACTIONS: np.ndarray = np.array([[-1, 0], [1, 0], [0, -1], [0, 1]], dtype=np.int64)

# A 15x15 maze with long corridors, dead ends and a few loops (a small analogue of OGBench's "giant"
# maze): 101 free cells, BFS diameter 50, 176 unordered cell pairs at distance >= 40.
GIANT15: tuple[str, ...] = (
    "###############",
    "#...#.....#...#",
    "###.#.###.###.#",
    "#.#.#...#.#...#",
    "#.#.#.#.#.#.#.#",
    "#...#...#.#.#.#",
    "#.#.#.#.#.#.#.#",
    "#.#.#.#.#.#.#.#",
    "#.#.###.#.#.#.#",
    "#...#...#...#.#",
    "#.###.#.#####.#",
    "#...#.#.......#",
    "###.#.#.#####.#",
    "#.....#.......#",
    "###############",
)

# A 7x7 serpentine (the quick variant): one corridor of 17 cells, BFS diameter 16.
SNAKE7: tuple[str, ...] = (
    "#######",
    "#.....#",
    "#####.#",
    "#.....#",
    "#.#####",
    "#.....#",
    "#######",
)

# An 11x11 maze with dead ends (the quick variant): 50 free cells, BFS diameter 38.
MAZE11: tuple[str, ...] = (
    "###########",
    "#...#.#...#",
    "#.#.#.#.#.#",
    "#.#.#...#.#",
    "#.#.#.###.#",
    "#.#.#.#.#.#",
    "#.#.#.#.#.#",
    "#.#.#...#.#",
    "#.#.#####.#",
    "#.........#",
    "###########",
)

LAYOUTS: dict[str, tuple[str, ...]] = {"giant15": GIANT15, "maze11": MAZE11, "snake7": SNAKE7}

# rgb_array rendering: pixels per cell side and the colour of each cell kind.
CELL_PIXELS = 16
COLORS: dict[str, tuple[int, int, int]] = {
    "#": (64, 64, 64),  # wall: dark grey
    ".": (255, 255, 255),  # free: white
    "G": (46, 160, 67),  # goal: green
    "A": (31, 119, 180),  # agent: blue (drawn over the goal when on it)
}

# gymnasium ids registered by register_envs() (on import of icml25.rl) -> layout name.
ENV_IDS: dict[str, str] = {
    "icml25/GridMaze-v0": "giant15",
    **{f"icml25/GridMaze-{name}-v0": name for name in LAYOUTS},
}
DEFAULT_EPISODE_STEPS = 200


def parse_layout(layout: str | Sequence[str]) -> np.ndarray:
    """Turn a layout name or a list of equal-length rows of ``#``/``.`` into a wall mask.

    Returns:
        bool array of shape ``(rows, cols)``, True where there is a wall.
    """
    if isinstance(layout, str):
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {sorted(LAYOUTS)} or a list of rows, got {layout!r}")
        layout = LAYOUTS[layout]
    rows = list(layout)
    if not rows or not all(isinstance(r, str) for r in rows):
        raise TypeError(f"layout must be a non-empty sequence of str rows, got {layout!r}")
    if len({len(r) for r in rows}) != 1:
        raise ValueError(f"layout rows must all have the same length, got lengths {[len(r) for r in rows]}")
    bad = {ch for r in rows for ch in r} - {"#", "."}
    if bad:
        raise ValueError(f"layout may only contain '#' (wall) and '.' (free), got {sorted(bad)}")
    walls = np.array([[ch == "#" for ch in r] for r in rows], dtype=bool)
    if walls.all():
        raise ValueError("layout must contain at least one free cell '.'")
    return walls


class GridMaze(gym.Env):
    """Goal-conditioned discrete grid maze (gymnasium API).

    ``reset(seed=..., options={"start": (r, c), "goal": (r, c)})`` places the agent and the goal (random
    distinct free cells when omitted) and returns ``(obs, info)`` with ``info["goal"]`` the goal
    observation. ``step(a)`` returns ``(obs, reward, terminated, truncated, info)``; reward is 1 on success
    and 0 otherwise; the episode terminates on success and is truncated after ``max_episode_steps``.

    Args:
        layout: a name in :data:`LAYOUTS` or a list of rows of ``#``/``.``.
        max_episode_steps: step budget per episode (``None``: never truncated by the env itself, as
            when built by ``gymnasium.make``, whose ``TimeLimit`` wrapper truncates instead).
        success_radius: success when the L1 grid distance to the goal cell is at most this.
        render_mode: ``None``, ``"ansi"`` (:meth:`render` returns the text picture) or ``"rgb_array"``
            (:meth:`render` returns a ``uint8`` array ``(rows * CELL_PIXELS, cols * CELL_PIXELS, 3)``).
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi", "rgb_array"], "render_fps": 4}

    def __init__(
        self,
        layout: str | Sequence[str] = "giant15",
        max_episode_steps: int | None = DEFAULT_EPISODE_STEPS,
        success_radius: int = 1,
        render_mode: str | None = None,
    ) -> None:
        if max_episode_steps is not None and (
            isinstance(max_episode_steps, bool)
            or not isinstance(max_episode_steps, int)
            or max_episode_steps <= 0
        ):
            raise ValueError(f"max_episode_steps must be a positive int or None, got {max_episode_steps!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode must be None or one of {self.metadata['render_modes']}, got {render_mode!r}"
            )
        self.render_mode = render_mode
        if not isinstance(success_radius, int) or success_radius < 0:
            raise ValueError(f"success_radius must be a non-negative int, got {success_radius!r}")
        self.walls = parse_layout(layout)
        self.shape = self.walls.shape
        self.free_cells: np.ndarray = np.argwhere(~self.walls)  # (n_free, 2), row-major order
        self._cell_index = {tuple(c): i for i, c in enumerate(self.free_cells.tolist())}
        self.max_episode_steps = max_episode_steps
        self.success_radius = success_radius
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(4)
        self._scale = np.array([max(self.shape[0] - 1, 1), max(self.shape[1] - 1, 1)], dtype=np.float64)
        self._dist_cache: np.ndarray | None = None
        self.agent = self.free_cells[0].copy()
        self.goal = self.free_cells[-1].copy()
        self._t = 0
        self._needs_reset = True

    # ------------------------------------------------------------------ geometry
    def cell_to_obs(self, cells: np.ndarray) -> np.ndarray:
        """Cells ``(..., 2)`` int -> observations ``(..., 2)`` float32 in [0, 1]."""
        return (np.asarray(cells, dtype=np.float64) / self._scale).astype(np.float32)

    def obs_to_cell(self, obs: np.ndarray) -> np.ndarray:
        """Observations ``(..., 2)`` -> nearest cells ``(..., 2)`` int64."""
        return np.rint(np.asarray(obs, dtype=np.float64) * self._scale).astype(np.int64)

    def move(self, cell: np.ndarray, action: int) -> np.ndarray:
        """The cell reached from ``cell`` with ``action`` (unchanged when blocked by a wall)."""
        nxt = np.asarray(cell) + ACTIONS[int(action)]
        if 0 <= nxt[0] < self.shape[0] and 0 <= nxt[1] < self.shape[1] and not self.walls[nxt[0], nxt[1]]:
            return nxt
        return np.asarray(cell).copy()

    def bfs_distances(self, cell: Sequence[int]) -> np.ndarray:
        """Shortest-path step counts from ``cell`` to every cell, shape ``(rows, cols)`` (-1 unreachable)."""
        dist = -np.ones(self.shape, dtype=np.int64)
        start = (int(cell[0]), int(cell[1]))
        if self.walls[start]:
            raise ValueError(f"cell must be a free cell of the maze, got wall cell {start}")
        dist[start] = 0
        queue = deque([start])
        while queue:
            r, c = queue.popleft()
            for dr, dc in ACTIONS.tolist():
                nr, nc = r + dr, c + dc
                if 0 <= nr < self.shape[0] and 0 <= nc < self.shape[1]:
                    if not self.walls[nr, nc] and dist[nr, nc] < 0:
                        dist[nr, nc] = dist[r, c] + 1
                        queue.append((nr, nc))
        return dist

    def distance_matrix(self) -> np.ndarray:
        """All-pairs BFS distances between free cells, shape ``(n_free, n_free)`` (cached)."""
        if self._dist_cache is None:
            rows = [
                self.bfs_distances(c)[self.free_cells[:, 0], self.free_cells[:, 1]] for c in self.free_cells
            ]
            self._dist_cache = np.stack(rows)
        return self._dist_cache

    def cell_id(self, cell: Sequence[int]) -> int:
        """Index of a free cell in :attr:`free_cells`."""
        key = (int(cell[0]), int(cell[1]))
        if key not in self._cell_index:
            raise ValueError(f"cell must be a free cell of the maze, got {key}")
        return self._cell_index[key]

    # ------------------------------------------------------------------ gymnasium API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        options = options or {}
        start, goal = options.get("start"), options.get("goal")
        if start is None:
            start = self.free_cells[self.np_random.integers(len(self.free_cells))]
        if goal is None:
            while True:
                goal = self.free_cells[self.np_random.integers(len(self.free_cells))]
                if len(self.free_cells) == 1 or tuple(goal) != tuple(start):
                    break
        self.cell_id(start), self.cell_id(goal)  # validates both
        self.agent = np.asarray(start, dtype=np.int64).copy()
        self.goal = np.asarray(goal, dtype=np.int64).copy()
        self._t = 0
        self._needs_reset = False
        return self.cell_to_obs(self.agent), self._info()

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """One move: ``action`` an int in ``[0, 3]`` (a Python or NumPy integer, or a 0-d integer array, as
        ``action_space.contains`` accepts); a float (``1.5``), a bool or a 1-element array is a ``TypeError``.

        Raises ``gymnasium.error.ResetNeeded`` before the first :meth:`reset` (no episode yet), as
        ``gymnasium.make``'s order-enforcing wrapper does.
        """
        if isinstance(action, np.ndarray) and action.shape == () and action.dtype.kind in "iu":
            action = action.item()
        a = check_int(action, "action", low=0, high=int(self.action_space.n) - 1)
        if self._needs_reset:
            raise gym.error.ResetNeeded("GridMaze.step() called before reset(): call reset(seed=...) first")
        self.agent = self.move(self.agent, a)
        self._t += 1
        info = self._info()
        terminated = bool(info["success"])
        budget = self.max_episode_steps
        truncated = (not terminated) and budget is not None and self._t >= budget
        return self.cell_to_obs(self.agent), float(terminated), terminated, truncated, info

    def _info(self) -> dict[str, Any]:
        l1 = int(np.abs(self.agent - self.goal).sum())
        return {
            "goal": self.cell_to_obs(self.goal),
            "goal_cell": self.goal.copy(),
            "success": l1 <= self.success_radius,
        }

    def render(self) -> str | np.ndarray | None:  # type: ignore[override]
        """The current state in ``render_mode``: text (``"ansi"``), an RGB image (``"rgb_array"``), or None."""
        if self.render_mode is None:
            gym.logger.warn(
                "GridMaze.render() was called without a render_mode: pass render_mode='ansi' or "
                "'rgb_array' to GridMaze(...) or gymnasium.make(...)"
            )
            return None
        if self.render_mode == "ansi":
            return self._ansi()
        return self._rgb()

    def _chars(self) -> np.ndarray:
        grid = np.where(self.walls, "#", ".")
        grid[self.goal[0], self.goal[1]] = "G"
        grid[self.agent[0], self.agent[1]] = "A"
        return grid

    def _ansi(self) -> str:
        """ASCII picture: ``#`` wall, ``.`` free, ``G`` goal, ``A`` agent (over the goal when on it)."""
        return "\n".join("".join(r) for r in self._chars())

    def _rgb(self) -> np.ndarray:
        chars = self._chars()
        cells = np.zeros((*self.shape, 3), dtype=np.uint8)
        for ch, rgb in COLORS.items():
            cells[chars == ch] = rgb
        return np.repeat(np.repeat(cells, CELL_PIXELS, axis=0), CELL_PIXELS, axis=1)


def register_envs() -> list[str]:
    """Register the grid mazes with gymnasium (idempotent; done on import of :mod:`icml25.rl`).

    Returns the ids of :data:`ENV_IDS`. ``gymnasium.make(id, render_mode=..., max_episode_steps=...)`` builds
    a :class:`GridMaze` (its own budget off) inside gymnasium's ``TimeLimit`` of ``max_episode_steps``
    (default 200, the env's own default).
    """
    for env_id, layout in ENV_IDS.items():
        if env_id not in gym.registry:
            gym.register(
                id=env_id,
                entry_point="icml25.rl.maze:GridMaze",
                kwargs={"layout": layout, "max_episode_steps": None},
                max_episode_steps=DEFAULT_EPISODE_STEPS,
            )
    return list(ENV_IDS)


def generate_stitch_dataset(
    maze: GridMaze,
    n_trajectories: int = 2000,
    length_range: tuple[int, int] = (8, 12),
    noise: float = 0.2,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Short trajectories of a noisy straight-line walker, in the D4RL/OGBench offline layout.

    Each trajectory starts in a uniformly random free cell with a random heading. At every step the walker
    takes a uniformly random action with probability ``noise``; otherwise it keeps its heading, choosing a
    new random open heading when the current one is blocked (so it follows corridors). Random actions are
    drawn among the moves that are not blocked by a wall: in a discrete maze a bump is a no-op that a
    greedy (temperature-0) policy cloned from such data can repeat forever, whereas in the paper's
    continuous mazes bumping into a wall still slides the agent.

    Returns:
        dict with ``observations`` ``(N, 2)`` float32, ``actions`` ``(N,)`` int64, ``next_observations``
        ``(N, 2)`` float32, ``rewards`` ``(N,)`` float32 (zeros: the data is reward-free),
        ``terminals`` ``(N,)`` bool (True on the last transition of each trajectory, as in OGBench) and
        ``timeouts`` ``(N,)`` bool (same as terminals: the walker's episodes are truncated, not terminated).
    """
    if not isinstance(maze, GridMaze):
        raise TypeError(f"maze must be a GridMaze, got {type(maze).__name__}")
    if not isinstance(n_trajectories, int) or n_trajectories <= 0:
        raise ValueError(f"n_trajectories must be a positive int, got {n_trajectories!r}")
    lo, hi = length_range
    if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
        raise ValueError(f"length_range must be (lo, hi) ints with 1 <= lo <= hi, got {length_range!r}")
    if not 0.0 <= noise <= 1.0:
        raise ValueError(f"noise must be a probability in [0, 1], got {noise!r}")
    rng = np.random.default_rng(seed)
    cells, actions, next_cells, ends = [], [], [], []
    for _ in range(n_trajectories):
        cell = maze.free_cells[rng.integers(len(maze.free_cells))]
        heading = int(rng.integers(4))
        length = int(rng.integers(lo, hi + 1))
        for t in range(length):
            open_dirs = [a for a in range(4) if not np.array_equal(maze.move(cell, a), cell)] or [heading]
            if rng.random() < noise:
                action = int(open_dirs[rng.integers(len(open_dirs))])
            else:
                if heading not in open_dirs:
                    heading = int(open_dirs[rng.integers(len(open_dirs))])
                action = heading
            nxt = maze.move(cell, action)
            cells.append(cell)
            actions.append(action)
            next_cells.append(nxt)
            ends.append(t == length - 1)
            cell = nxt
    ends_arr = np.array(ends, dtype=bool)
    return {
        "observations": maze.cell_to_obs(np.array(cells)),
        "actions": np.array(actions, dtype=np.int64),
        "next_observations": maze.cell_to_obs(np.array(next_cells)),
        "rewards": np.zeros(len(cells), dtype=np.float32),
        "terminals": ends_arr,
        "timeouts": ends_arr.copy(),
    }
