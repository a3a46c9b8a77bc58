"""`python -m speck.tensor.compat script.py [args...]`: run a tinygrad script on speck (a module of its own, so the
package speck.tensor imports is not executed a second time as __main__)."""

from speck.tensor.compat import main

main()
