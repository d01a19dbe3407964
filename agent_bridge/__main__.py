"""`python -m agent_bridge`: the command line, as `agent-bridge` runs it."""

import sys

from agent_bridge.cli.main import main

sys.exit(main())
