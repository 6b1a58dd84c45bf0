"""``python -m localpv_emulator.apiserver``: serve until SIGINT/SIGTERM."""

import sys

from localpv_emulator.apiserver.standalone import main

sys.exit(main())
