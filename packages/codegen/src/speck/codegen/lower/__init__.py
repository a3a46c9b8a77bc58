"""The lowering passes `full_rewrite_to_sink` runs, one small module per stage (rules as PatternMatcher tables)."""
