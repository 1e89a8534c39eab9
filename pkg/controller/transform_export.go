package controller

// Transform is the informers' transform, for tools that list objects
// themselves (`nftpolicy explain`) and must see them as the agent does.
func Transform(obj any) (any, error) { return transform(obj) }
