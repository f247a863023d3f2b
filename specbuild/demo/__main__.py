"""`python -m specbuild.demo` (what `make demo` runs): see specbuild.demo.run."""

import sys

from specbuild.demo.run import main

sys.exit(main())
