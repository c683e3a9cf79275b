"""Where a cluster's tasks live, and what each task is given.

- :mod:`.ports`: free ports, held race-free; who holds a busy port;
- :mod:`.slurm`: Slurm's compressed host lists and each task's place in a step;
- :mod:`.tfconfig`: TF_CONFIG as Kubeflow's TFJob and TensorFlow write it;
- :mod:`.cluster`: one validated cluster description, its sources and its renders;
- :mod:`.taskenv`: the environment every task runs in (TF_CONFIG, quiet logs, legacy Keras);
- :mod:`.devices`: which GPUs and how many threads each task gets.
"""
