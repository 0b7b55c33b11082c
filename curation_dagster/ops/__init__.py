"""Operating it: the workdir (its config and Dagster instance, event-log storage), the
deployment on one machine, submitting to one, and the Kubernetes pod specs."""
