import sys

from arbiterd.main import main

sys.exit(main())
