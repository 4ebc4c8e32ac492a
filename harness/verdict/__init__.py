"""Stage 6, the verdict: a case's result rows + the xfail registry entries that match it ->
one outcome (passed, failed, xfailed, xpassed), decided once (``judge``); the registry's
grammar (``registry``); which mutants the checks caught (``mutation_score``). Receives rows
and entries; hands the outcome to the plugin and the results stage."""
