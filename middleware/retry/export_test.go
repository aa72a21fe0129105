package retry

// Aliases for the package's external tests.
const DefaultBudgetRatio = defaultBudgetRatio
const DefaultBudgetWindow = defaultBudgetWindow
const DefaultMinRetriesPerSecond = defaultMinRetriesPerSecond

// Explored is explored, for the learned policy's tests.
var Explored = explored
