"""Mask the credentials a store's runs recorded before this project masked them:
`python -m sweeper.mask_store [tracking.uri=URI]`.

Runs recorded since hold none (docs/security.md); an older store's tags (a sweep's `command`, its note) and
text artifacts (config.yaml, sweep.yaml) may hold the store's password. This rewrites each in place
(tracking.masking) and prints how many it masked. tracking.uri defaults to $MLFLOW_TRACKING_URI, else
sqlite:///mlflow.db; give it without its password (PGPASSWORD, ~/.pgpass) or masked, as the record has it.
"""

from __future__ import annotations

import sys

from cli.credentials import mask
from cli.entry import command
from config.compose import compose
from config.help import composed_config, config_groups
from tracking.masking import mask_recorded
from tracking.store import connect


@command("leaner-mask-store", show_config=composed_config, options=config_groups)
def main(argv: list[str]) -> int:
    uri = compose(argv).tracking.uri
    masked = mask_recorded(connect(uri, create=False))  # a new store recorded nothing
    print(
        f"masked {masked} recorded credential{'s' * (masked != 1)} (tags and text artifacts) in {mask(uri)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
