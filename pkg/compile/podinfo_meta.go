package compile

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// PodInfo's metav1.Object methods, for client-go's stores, indexes and
// reflectors (keys, the namespace index, resourceVersions, a watch's
// bookmark). A PodInfo keeps only what the compiler reads: the getters of
// everything else return zero values and their setters change nothing.
// Setting the namespace or the name keeps Key in step.

var _ metav1.Object = (*PodInfo)(nil)

func (p *PodInfo) GetNamespace() string                          { return p.Namespace }
func (p *PodInfo) SetNamespace(ns string)                        { p.SetKey(ns, p.Name) }
func (p *PodInfo) GetName() string                               { return p.Name }
func (p *PodInfo) SetName(name string)                           { p.SetKey(p.Namespace, name) }
func (p *PodInfo) GetGenerateName() string                       { return "" }
func (p *PodInfo) SetGenerateName(string)                        {}
func (p *PodInfo) GetUID() types.UID                             { return "" }
func (p *PodInfo) SetUID(types.UID)                              {}
func (p *PodInfo) GetResourceVersion() string                    { return p.ResourceVersion }
func (p *PodInfo) SetResourceVersion(rv string)                  { p.ResourceVersion = rv }
func (p *PodInfo) GetGeneration() int64                          { return 0 }
func (p *PodInfo) SetGeneration(int64)                           {}
func (p *PodInfo) GetSelfLink() string                           { return "" }
func (p *PodInfo) SetSelfLink(string)                            {}
func (p *PodInfo) GetCreationTimestamp() metav1.Time             { return p.CreationTimestamp }
func (p *PodInfo) SetCreationTimestamp(t metav1.Time)            { p.CreationTimestamp = t }
func (p *PodInfo) GetDeletionTimestamp() *metav1.Time            { return p.DeletionTimestamp }
func (p *PodInfo) SetDeletionTimestamp(t *metav1.Time)           { p.DeletionTimestamp = t }
func (p *PodInfo) GetDeletionGracePeriodSeconds() *int64         { return nil }
func (p *PodInfo) SetDeletionGracePeriodSeconds(*int64)          {}
func (p *PodInfo) GetLabels() map[string]string                  { return p.Labels }
func (p *PodInfo) SetLabels(l map[string]string)                 { p.Labels = l }
func (p *PodInfo) GetAnnotations() map[string]string             { return p.Annotations }
func (p *PodInfo) SetAnnotations(a map[string]string)            { p.Annotations = a }
func (p *PodInfo) GetFinalizers() []string                       { return nil }
func (p *PodInfo) SetFinalizers([]string)                        {}
func (p *PodInfo) GetOwnerReferences() []metav1.OwnerReference   { return nil }
func (p *PodInfo) SetOwnerReferences([]metav1.OwnerReference)    {}
func (p *PodInfo) GetManagedFields() []metav1.ManagedFieldsEntry { return nil }
func (p *PodInfo) SetManagedFields([]metav1.ManagedFieldsEntry)  {}
