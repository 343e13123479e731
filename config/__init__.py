"""The run and sweep configuration: schema, composition, validation, identity and grid (the bottom layer
above tasks/ and models/)."""
