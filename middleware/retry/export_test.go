package retry

// Aliases for the package's external tests.
const DefaultBudgetRatio = defaultBudgetRatio
const DefaultBudgetWindow = defaultBudgetWindow
const DefaultMinRetriesPerSecond = defaultMinRetriesPerSecond
