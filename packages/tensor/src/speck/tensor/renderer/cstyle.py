"""tinygrad.renderer.cstyle: speck.codegen's C renderer. `ClangRenderer` renders C for clang/gcc (the CLANG backend,
`DEV=CPU:CLANG`); it is speck's only C-like renderer, so it is also the C-style family `CStyleLanguage`."""

from speck.codegen.renderer.cstyle import ClangRenderer

CStyleLanguage = ClangRenderer

__all__ = ["CStyleLanguage", "ClangRenderer"]
