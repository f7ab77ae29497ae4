from django.urls import path

from . import views

urlpatterns = [
    path("", views.goal_tree, name="goal_tree"),
    path("<int:pk>/", views.goal_detail, name="goal_detail"),
    path("<int:pk>/children/", views.goal_children, name="goal_children"),
    path("<int:pk>/progress/", views.progress, name="goal_progress"),
    path("progress/", views.progress, name="progress"),
]
