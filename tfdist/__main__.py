"""``python -m tfdist``: versions, devices and cluster role, for bug reports
(see `tfdist.info`)."""

from tfdist.info import main

main()
