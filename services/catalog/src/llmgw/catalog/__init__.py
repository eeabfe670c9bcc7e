"""The catalog: the only writer of the models (profiles, scaling, changes), with their rules."""
