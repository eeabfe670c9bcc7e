"""The admin API (`api`) and the operators' operations every face asks (`operations`)."""
