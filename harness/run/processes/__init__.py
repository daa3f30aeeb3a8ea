"""The processes a run keeps running: worker pools, pre-forked standbys, a service's instances and its build."""
