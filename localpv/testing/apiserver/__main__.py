"""``python -m localpv.testing.apiserver``: serve until SIGINT/SIGTERM."""

import sys

from localpv.testing.apiserver.standalone import main

sys.exit(main())
