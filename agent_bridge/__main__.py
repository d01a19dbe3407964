import sys

from agent_bridge.cli import main

sys.exit(main())
