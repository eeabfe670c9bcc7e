"""Where a request goes and how it gets there: the models and ready replicas (`directory`), the
choice of a replica (`balance`), prefixes engines hold (`oracle`, `kvevents`), engines' health
(`health`), demand for on-demand models (`demand`), and the connections to engines (`upstream`)."""
