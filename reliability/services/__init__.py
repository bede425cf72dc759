"""Real PostgreSQL, Redis and HAProxy processes on 127.0.0.1, each in its own temporary
directory, for the cluster tests, ``scripts/cluster.sh``, ``benchmarks.cluster`` and the
reliability suite's cluster loops. Started from Debian's packages; never the system services."""
