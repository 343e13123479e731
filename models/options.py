"""The names the models accept, without torch: configuration (config.validate) checks a choice against
them before any process pays for importing torch.

Each name maps to its short label, the one run names (config.identity) and figures (analysis.style) spell.
"""

# models.embedding: the tokens' scratch dimensions.
EMBEDDINGS = {"onehot": "OH", "binary": "BN", "none": "NA"}
# models.losses: sparsemax (l2) or softmax (negative entropy) weights.
REGULARIZERS = {"l2": "L2", "ne": "NE"}
