import sys

from winnow_client import main

sys.exit(main())
