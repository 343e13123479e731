"""The names the models accept, without torch: configuration (config.compose) checks a choice against
them before any process pays for importing torch."""

EMBEDDINGS = ("onehot", "binary", "none")  # models.embedding: the scratch dimensions of the tokens
REGULARIZERS = ("l2", "ne")  # models.losses: sparsemax (l2) or softmax (negative entropy) weights
