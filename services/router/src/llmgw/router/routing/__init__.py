"""Where a request goes: the models and ready replicas (`directory`), the choice of a replica
(`balance`, pure), prefixes engines hold (`oracle`, `kvevents`), engines' health (`health`),
and demand for on-demand models (`demand`)."""
