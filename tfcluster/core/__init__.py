"""The rules everything shares, one module each: the rooms every other folder may import.

- :mod:`.version`: tfcluster's one version string;
- :mod:`.exits`: what exit codes mean, and a child's end as an exit status;
- :mod:`.environment`: every ``TFCLUSTER_*`` environment variable, in one table;
- :mod:`.patches`: every change tfcluster makes to a TensorFlow callable, in one registry (docs/patches.md);
- :mod:`.errors`: every user-facing error, one family, naming its parameters;
- :mod:`.checks`: the checks of a count or a duration, worded the same everywhere;
- :mod:`.tferrors`: one line of a TensorFlow error, and which errors a lost task causes;
- :mod:`.logs`: how tfcluster's log lines look in the CLI, the launcher and TF1 mode;
- :mod:`.programs`: a program run by a mode (TF1, TF2): its command rewritten, the program run as ``__main__``;
- :mod:`.duplicates`: TF 2.21's false duplicate-request aborts and the one rerun of them;
- :mod:`.posix`: the POSIX features the launcher uses, and what is off where one is missing;
- :mod:`.private`: files only their owner reads (task logs, cluster files);
- :mod:`.tfguard`: which TensorFlow is installed, without importing it.
"""
