package compile

// MaxPolicyRefChars lets the external tests check names against the cut.
const MaxPolicyRefChars = maxPolicyRefChars
