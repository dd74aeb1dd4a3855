"""`python -m dflash_studio`: the same as the `dflash-studio` console script."""
import sys

from dflash_studio import main

sys.exit(main())
