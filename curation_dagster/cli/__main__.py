"""``python -m curation_dagster.cli``: the ``curate`` command without its console script."""

from curation_dagster.cli import main
from stages.parallel import exit_process

exit_process(main())
