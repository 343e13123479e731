"""One look for every figure: colours, line styles and short labels.

Embeddings keep their colour and regularizers their line style in every
figure (OH, BN, NA; L2, NE); Lloyd's algorithm is always black.
"""

from __future__ import annotations

from models.options import EMBEDDINGS, REGULARIZERS
from tracking.view import EMBEDDING_COLORS  # the MLflow UI's run colours too

LLOYD = "Lloyd"
LLOYD_COLOR = "black"

SHORT = {"model.embedding": EMBEDDINGS, "loss.regularizer": REGULARIZERS}  # the run names' labels too
REGULARIZER_STYLES = {"l2": "-", "ne": "--"}
# Axis values that are neither embeddings nor regularizers (lr, n, d, k, family, ...) cycle through these.
CYCLE = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive")
AXIS_NAMES = {
    "loss.tau": "tau",
    "optim.lr": "lr",
    "task.n": "n",
    "task.d": "d",
    "task.k": "k",
    "task.family": "family",
    "task.init": "init",
    "model.embedding": "emb",
    "loss.regularizer": "reg",
    "train.steps": "steps",
}


def short(key: str, value: object) -> str:
    """'model.embedding', 'binary' -> 'BN'; 'task.d', 32 -> 'd=32'."""
    if key in SHORT:
        return SHORT[key].get(str(value), str(value))
    return (
        f"{AXIS_NAMES.get(key, key)}={value:g}"
        if isinstance(value, float)
        else f"{AXIS_NAMES.get(key, key)}={value}"
    )


def label(config: dict) -> str:
    """A series label from the config values that distinguish it, e.g. 'OH-L2'."""
    return "-".join(short(key, value) for key, value in config.items())


def color(config: dict, index: int = 0) -> str:
    """Embedding colour when the series has an embedding, else the index-th colour of the cycle."""
    embedding = config.get("model.embedding")
    if embedding in EMBEDDING_COLORS and set(config) <= {"model.embedding", "loss.regularizer"}:
        return EMBEDDING_COLORS[embedding]
    return CYCLE[index % len(CYCLE)]


def linestyle(config: dict) -> str:
    return REGULARIZER_STYLES.get(str(config.get("loss.regularizer")), "-")


def order(key: str, value: object) -> tuple:
    """Sort key that puts series in the conventional order: OH, BN, NA; L2, NE; numbers ascending."""
    known = list(SHORT.get(key, {}))
    if str(value) in known:
        return (0, known.index(str(value)), "")
    return (1, value, "") if isinstance(value, (int, float)) else (2, 0, str(value))
