from stages.cli import main
from stages.parallel import exit_process

exit_process(main())
