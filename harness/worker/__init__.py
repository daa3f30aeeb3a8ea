"""Worker processes: the system under test, run as real OS processes the harness can SIGKILL."""
