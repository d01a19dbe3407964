import sys

from agent_bridge.cli.main import main

sys.exit(main())
