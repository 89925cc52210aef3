"""python -m cgpu_device_plugin"""

import sys

from cgpu_device_plugin.main import main

sys.exit(main())
