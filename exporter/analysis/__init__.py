"""Pure statistics over results: intervals, comparisons, the speculation advisor."""
