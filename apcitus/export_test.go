package apcitus

// HashText is hashText, for the tests.
var HashText = hashText
